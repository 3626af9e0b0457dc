"""Train an adapter: a LoRA for SmolLM2-135M-Instruct on (prompt, reply) pairs (the agent model: BFCL's held-out
oracle trajectories).

Runs on a GPU machine with torch, transformers and peft (not part of the artifact's own environment; the committed
adapter is what set-up uses, so nobody needs to train). Deterministic by construction: fixed seeds, one sequence
per step in a seeded order, no dropout, `torch.use_deterministic_algorithms(True)` (cuBLAS workspace pinned); the
attention kernel is PyTorch's SDPA unless deterministic mode refuses it, then the math kernel.

    python -m artifact.models.train --data train.jsonl --base HF_DIR --out ADAPTER_DIR

HF_DIR is the base model in Hugging Face format (scripts/vllm-convert-gguf.py makes it from the shipped Q4_1 GGUF:
the weights the served model has, dequantized). The loss is the mean cross-entropy over the reply tokens and the
closing `<|im_end|>` only; prompt tokens carry no loss. ADAPTER_DIR gets the PEFT adapter and `training.json`
(hyper-parameters, versions, device, data sha256, loss per epoch and every 50 steps, wall time).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import platform
import sys
import time
from pathlib import Path

TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
END = "<|im_end|>"


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m artifact.models.train", description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--data",
        type=Path,
        required=True,
        help="training pairs: JSON lines with prompt and reply (python -m artifact.workloads.bfcl.oracle)",
    )
    p.add_argument("--base", type=Path, required=True, help="base model directory (Hugging Face format)")
    p.add_argument("--out", type=Path, required=True, help="adapter output directory")
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=int, default=16)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--warmup", type=int, default=30, help="linear warm-up steps; then cosine decay to 10 %%")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--attn", choices=["sdpa", "eager"], default="sdpa")
    p.add_argument("--limit", type=int, default=0, help="train on the first N pairs only (a rehearsal)")
    return p.parse_args(argv)


def load_pairs(path: Path) -> tuple[list[dict], str]:
    raw = path.read_bytes()
    return [json.loads(line) for line in raw.decode("utf-8").splitlines() if line.strip()], hashlib.sha256(
        raw
    ).hexdigest()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts: deterministic cuBLAS
    import peft
    import torch
    import transformers
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(args.seed)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    torch.backends.cuda.matmul.allow_tf32 = False
    device = "cuda" if torch.cuda.is_available() else "cpu"

    pairs, data_sha = load_pairs(args.data)
    if args.limit:
        pairs = pairs[: args.limit]
    tok = AutoTokenizer.from_pretrained(str(args.base))
    end_id = tok.convert_tokens_to_ids(END)
    examples = []
    for p in pairs:  # prompt and reply tokenized apart: the server tokenizes the prompt, the model writes the reply
        prompt = tok(p["prompt"], add_special_tokens=False)["input_ids"]
        reply = tok(p["reply"], add_special_tokens=False)["input_ids"] + [end_id]
        examples.append((prompt, reply))

    def build(attn: str):
        torch.manual_seed(args.seed)
        model = AutoModelForCausalLM.from_pretrained(
            str(args.base), torch_dtype=torch.float32, attn_implementation=attn
        )
        cfg = LoraConfig(
            r=args.rank,
            lora_alpha=args.alpha,
            lora_dropout=0.0,
            target_modules=TARGETS,
            bias="none",
            task_type="CAUSAL_LM",
        )
        return get_peft_model(model, cfg).to(device)

    def loss_of(model, prompt, reply):
        ids = torch.tensor([prompt + reply], device=device)
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=device == "cuda"):
            out = model(input_ids=ids, logits_to_keep=len(reply) + 1)
        logits = out.logits[0, :-1].float()  # the positions that predict the reply tokens
        return torch.nn.functional.cross_entropy(logits, torch.tensor(reply, device=device))

    attn = args.attn
    model = build(attn)
    try:  # deterministic mode refuses kernels without a deterministic backward: find out before training
        loss_of(model, *examples[0]).backward()
    except RuntimeError as exc:
        if attn == "eager":
            raise
        print(f"train: {attn} attention refused in deterministic mode ({str(exc)[:120]}); using eager", file=sys.stderr)
        attn = "eager"
    model = build(attn)  # fresh weights either way (the probe step touched the gradients)

    params = [p for p in model.parameters() if p.requires_grad]
    n_trainable = sum(p.numel() for p in params)
    opt = torch.optim.AdamW(params, lr=args.lr, weight_decay=0.0)
    total = args.epochs * len(examples)

    def lr_at(step: int) -> float:
        if step < args.warmup:
            return (step + 1) / args.warmup
        frac = (step - args.warmup) / max(1, total - args.warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    gen = torch.Generator().manual_seed(args.seed)
    log, epochs, step, t0 = [], [], 0, time.monotonic()
    model.train()
    for epoch in range(args.epochs):
        order = torch.randperm(len(examples), generator=gen).tolist()
        running = 0.0
        for i in order:
            loss = loss_of(model, *examples[i])
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            opt.zero_grad(set_to_none=True)
            running += loss.item()
            step += 1
            if step % 50 == 0:
                log.append({"step": step, "loss": round(loss.item(), 5), "s": round(time.monotonic() - t0, 1)})
                print(
                    f"train: step {step}/{total} loss {loss.item():.4f} ({time.monotonic() - t0:.0f} s)",
                    file=sys.stderr,
                    flush=True,
                )
        epochs.append({"epoch": epoch + 1, "mean_loss": round(running / len(examples), 5)})
    wall = time.monotonic() - t0

    args.out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(args.out))
    record = {
        "base": str(args.base),
        "data": args.data.name,
        "data_sha256": data_sha,
        "pairs": len(examples),
        "reply_tokens": sum(len(r) for _, r in examples),
        "prompt_tokens": sum(len(p) for p, _ in examples),
        "lora": {
            "r": args.rank,
            "alpha": args.alpha,
            "dropout": 0.0,
            "targets": TARGETS,
            "trainable_parameters": n_trainable,
        },
        "optimizer": {
            "name": "AdamW",
            "lr": args.lr,
            "weight_decay": 0.0,
            "warmup_steps": args.warmup,
            "schedule": "linear warm-up, cosine to 10 %",
            "grad_clip": 1.0,
            "batch": 1,
            "epochs": args.epochs,
            "steps": total,
        },
        "precision": "fp32 weights, bf16 autocast" if device == "cuda" else "fp32",
        "attention": attn,
        "seed": args.seed,
        "deterministic_algorithms": True,
        "loss": "mean cross-entropy over reply tokens and the closing <|im_end|> (prompt tokens carry none)",
        "epochs": epochs,
        "log": log,
        "wall_s": round(wall, 1),
        "device": torch.cuda.get_device_name(0) if device == "cuda" else platform.processor(),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "peft": peft.__version__,
            "cuda": torch.version.cuda,
            "python": platform.python_version(),
        },
    }
    (args.out / "training.json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"train: {total} steps in {wall:.0f} s; epoch losses {[e['mean_loss'] for e in epochs]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
