"""Answer checking: the final answer of a math solution, math-verify or a numeric fallback,
SQuAD-normalised exact match and token F1, the first integer of a completion."""

from __future__ import annotations

import collections
import logging
import re
import string

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
_INTEGER = re.compile(r"-?\d+")


def gsm8k_final_answer(answer: str) -> str:
    """The final answer of a GSM8K-style solution (text after the last ``####``), commas removed."""
    text = answer.rsplit("####", 1)[-1] if "####" in answer else answer
    return text.strip().replace(",", "")


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (or ``\\fbox{...}``), braces balanced."""
    start = max(text.rfind("\\boxed{"), text.rfind("\\fbox{"))
    if start < 0:
        return None
    i = text.index("{", start) + 1
    depth = 1
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j]
    return None


def last_number(text: str) -> str | None:
    found = _NUMBER.findall(text)
    return found[-1] if found else None


def _normalize_answer(text: str) -> str:
    t = text.strip().strip("$").strip().rstrip(".").replace(",", "").replace(" ", "")
    t = re.sub(r"^\\text\{(.*)\}$", r"\1", t)
    try:
        value = float(t)
    except ValueError:
        return t
    return str(int(value)) if value.is_integer() else repr(value)


def fallback_match(completion: str, gold: str) -> bool:
    """Without math-verify: the last boxed content (else the last number) equals the gold."""
    pred = last_boxed(completion)
    if pred is None:
        pred = last_number(completion)
    return pred is not None and _normalize_answer(pred) == _normalize_answer(gold)


def math_verify_available() -> bool:
    try:
        import math_verify  # noqa: F401
    except ImportError:
        return False
    return True


def math_verify_match(completion: str, gold: str) -> bool:
    """``math-verify`` equivalence, thread-safe (its signal-based timeouts are off)."""
    from math_verify import parse, verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    wrapped = gold if "$" in gold or "\\boxed" in gold else f"${gold}$"
    gold_parsed = parse(wrapped, parsing_timeout=None)
    pred_parsed = parse(completion, parsing_timeout=None)
    if not gold_parsed or not pred_parsed:
        return False
    return bool(verify(gold_parsed, pred_parsed, timeout_seconds=None))


def normalize_qa(text: str) -> str:
    """SQuAD normalisation: lower case, no punctuation, no articles, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def exact_match(prediction: str, gold: str) -> float:
    return float(normalize_qa(prediction) == normalize_qa(gold))


def token_f1(prediction: str, gold: str) -> float:
    """SQuAD token F1 between a prediction and one gold answer."""
    pred, ref = normalize_qa(prediction).split(), normalize_qa(gold).split()
    if not pred or not ref:
        return float(pred == ref)
    common = collections.Counter(pred) & collections.Counter(ref)
    same = sum(common.values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def first_integer(text: str) -> int | None:
    found = _INTEGER.search(text)
    return int(found.group()) if found else None
