"""The generative-reward example's scoring function: it asks the run's served judge to grade each answer.

``reward.custom_reward_function.path=examples/generative_reward/judge_reward.py`` with ``reward.reward_model.enable``:
veRL's signature, the judge reached through the router at ``reward_router_address`` (OpenAI's chat API), its text
``score: N`` parsed into a reward ``N / 6``. A verdict that does not parse raises, so the sample is counted in
``reward/error_count`` (and a judge that never parses stops the run) instead of scoring a silent 0.

``acc`` is not the reward: it is whether the answer is exactly the reference, measured here so that a run shows what
the judge's grades taught the policy.
"""

from __future__ import annotations

import json
import re
import urllib.request

MAX_GRADE = 6
_VERDICT = re.compile(r"score:\s*(\d)")


def ask_judge(reward_router_address: str, answer: str, reference: str, timeout: float = 60.0) -> str:
    """The judge's reply to the example's question (greedy, a few tokens: ``score: 3`` is eight of the demo's)."""
    body = {
        "messages": [{"role": "user", "content": f"Reference: {reference} Answer: {answer}"}],
        "max_tokens": 12,
        "temperature": 0,
    }
    request = urllib.request.Request(
        f"http://{reward_router_address}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as reply:
        return json.load(reply)["choices"][0]["message"]["content"]


def compute_score(
    data_source, solution_str, ground_truth, extra_info=None, reward_router_address=None, reward_model_tokenizer=None
):
    """``{"score": grade / 6, "grade", "acc"}`` from the judge's verdict on ``solution_str``."""
    if reward_router_address is None:
        raise ValueError("judge_reward needs a served judge: set reward.reward_model.enable=true")
    answer = solution_str.strip()
    verdict = ask_judge(reward_router_address, answer, str(ground_truth))
    match = _VERDICT.search(verdict)
    if match is None or int(match.group(1)) > MAX_GRADE:
        raise ValueError(f"the judge's verdict {verdict!r} is not 'score: 0' … 'score: {MAX_GRADE}'")
    grade = int(match.group(1))
    return {"score": grade / MAX_GRADE, "grade": grade, "acc": float(answer == str(ground_truth).strip())}
