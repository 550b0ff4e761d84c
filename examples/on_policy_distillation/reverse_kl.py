"""The student's reverse KL to its teacher, measured exactly on the student's own samples.

    python examples/on_policy_distillation/reverse_kl.py STUDENT_HF_DIR TEACHER_HF_DIR VAL_PARQUET

The student answers each held-out question ``--samples`` times (temperature 1, as in training, at most
``--max-new-tokens`` tokens); at every position of each answer both models' next-token distributions are compared
over the whole vocabulary, KL(p_student ‖ p_teacher) = Σ_v p_s(v) (log p_s(v) − log p_t(v)), and the result is the
mean over the answers' tokens (the last one the end-of-sequence token when the student stops). No estimator: the
distillation losses estimate this quantity from one token (k1, k3) or bound a forward KL over the teacher's top-k;
this is the number they are meant to push down.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging


@torch.no_grad()
def reverse_kl(
    student_dir: str | Path,
    teacher_dir: str | Path,
    val_parquet: str | Path,
    *,
    prompts: int = 64,
    samples: int = 4,
    max_new_tokens: int = 8,
    seed: int = 0,
) -> float:
    """The mean per-token KL(student ‖ teacher) over the student's sampled answers to the first ``prompts`` rows of
    ``val_parquet`` (veRL's schema: chat messages in ``prompt``)."""
    hf_logging.disable_progress_bar()
    tokenizer = AutoTokenizer.from_pretrained(str(student_dir))
    student = AutoModelForCausalLM.from_pretrained(str(student_dir), dtype=torch.float32).eval()
    teacher = AutoModelForCausalLM.from_pretrained(str(teacher_dir), dtype=torch.float32).eval()
    torch.manual_seed(seed)
    total, tokens = 0.0, 0
    for messages in pd.read_parquet(val_parquet)["prompt"].head(prompts):
        prompt = tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, return_tensors="pt")
        prompt = prompt if isinstance(prompt, torch.Tensor) else prompt["input_ids"]
        sequences = student.generate(
            prompt.repeat(samples, 1),
            attention_mask=torch.ones(samples, prompt.shape[1], dtype=torch.long),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new_tokens,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        )
        answer = sequences[:, prompt.shape[1] :]
        # a token is the answer's while no end-of-sequence token came before it
        ended = torch.cumsum((answer == tokenizer.eos_token_id).long(), dim=1)
        mask = (ended - (answer == tokenizer.eos_token_id).long()) == 0
        # the distributions that chose each answer token: the logits one position before it
        positions = slice(prompt.shape[1] - 1, sequences.shape[1] - 1)
        log_s = torch.log_softmax(student(sequences).logits[:, positions].float(), dim=-1)
        log_t = torch.log_softmax(teacher(sequences).logits[:, positions].float(), dim=-1)
        kl = (log_s.exp() * (log_s - log_t)).sum(-1)
        total += float(kl[mask].sum())
        tokens += int(mask.sum())
    return total / max(tokens, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("student", type=Path)
    parser.add_argument("teacher", type=Path)
    parser.add_argument("val_parquet", type=Path)
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=8)
    args = parser.parse_args()
    value = reverse_kl(
        args.student,
        args.teacher,
        args.val_parquet,
        prompts=args.prompts,
        samples=args.samples,
        max_new_tokens=args.max_new_tokens,
    )
    print(f"reverse KL(student ‖ teacher): {value:.4f} nats a token")


if __name__ == "__main__":
    main()
