"""Convert a GGUF (the embedded SmolLM2-135M-Instruct Q4_1) to a Hugging Face directory that vLLM can serve on a CPU
(vLLM 0.11.0's GGUF kernels are CUDA-only). Runs with vLLM's interpreter (needs torch, transformers, gguf,
accelerate); called by artifact/engines/vllm/env.py on first use.

    python scripts/vllm-convert-gguf.py MODEL.gguf OUT_DIR DTYPE QUANT

The weights are the GGUF's quantized weights dequantized (labelled so in OUT_DIR/conversion.json). transformers'
GGUF tokenizer comes out wrong for this model family (eos <|im_start|>, a BOS added, a SentencePiece copy of the
GGUF): it is set to what the model's own tokenizer is, GPT-2 byte-level BPE without BOS, eos and pad <|im_end|>.
"""

import json
import sys
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer


def _version(dist: str):
    from importlib import metadata

    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


BYTE_LEVEL = {"add_prefix_space": False, "trim_offsets": True, "use_regex": True}
CHATML_END = "<|im_end|>"


def fix_tokenizer(out: Path) -> None:
    tj = json.loads((out / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    if CHATML_END not in vocab:
        sys.exit(f"error: {CHATML_END} not in the GGUF's vocabulary: this converter knows ChatML models only")
    tj["normalizer"] = None
    tj["pre_tokenizer"] = {"type": "ByteLevel", **BYTE_LEVEL}
    tj["post_processor"] = {"type": "ByteLevel", **BYTE_LEVEL, "trim_offsets": False}
    tj["decoder"] = {"type": "ByteLevel", **BYTE_LEVEL}
    tj["model"]["byte_fallback"] = False
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False, indent=1))
    tc = json.loads((out / "tokenizer_config.json").read_text())
    tc.update(
        tokenizer_class="GPT2Tokenizer",
        add_bos_token=False,
        add_eos_token=False,
        eos_token=CHATML_END,
        pad_token=CHATML_END,
    )
    for key in ("eos_token_id", "pad_token_id"):  # written from the GGUF's (wrong) ids: make them agree
        if key in tc:
            tc[key] = vocab[CHATML_END]
    tc.pop("legacy", None)
    (out / "tokenizer_config.json").write_text(json.dumps(tc, ensure_ascii=False, indent=1))
    stm = out / "special_tokens_map.json"
    if stm.exists():
        sp = json.loads(stm.read_text())
        sp.update(eos_token=CHATML_END, pad_token=CHATML_END)
        stm.write_text(json.dumps(sp, ensure_ascii=False, indent=1))
    (out / "tokenizer.model").unlink(missing_ok=True)
    eos = vocab[CHATML_END]
    for name in ("config.json", "generation_config.json"):
        path = out / name
        if path.exists():
            cfg = json.loads(path.read_text())
            cfg.update(eos_token_id=eos, pad_token_id=eos)
            path.write_text(json.dumps(cfg, indent=1))


def check_tokenizer(out: Path) -> None:
    tok = AutoTokenizer.from_pretrained(str(out))
    ids = tok("<|im_start|>user\nHello world<|im_end|>\n")["input_ids"]
    start, end = tok.convert_tokens_to_ids(["<|im_start|>", CHATML_END])
    if ids[0] != start or end not in ids or tok.eos_token_id != end:
        sys.exit(f"error: the converted tokenizer is wrong (ids {ids[:8]}, eos {tok.eos_token_id})")
    if tok.decode(ids) != "<|im_start|>user\nHello world<|im_end|>\n":
        sys.exit(f"error: the converted tokenizer does not round-trip: {tok.decode(ids)!r}")


def save_weights(model, out: Path) -> None:
    """The dequantized weights as safetensors. Newer transformers mark a model loaded from GGUF as not
    serializable; its state dict is written directly then, after checking that every weight is a plain float
    tensor (a transformers that kept GGUF blocks packed would otherwise write them unconverted)."""
    try:
        model.save_pretrained(str(out), safe_serialization=True)
        return
    except ValueError:
        pass
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # tied to embed_tokens (safetensors refuses shared storage)
    bad = [k for k, v in state.items() if not v.is_floating_point()]
    if bad:
        sys.exit(
            f"error: this transformers ({transformers.__version__}) keeps GGUF weights packed ({bad[0]}); "
            "use one that dequantizes them (e.g. 4.56.2, as in requirements-vllm.lock)"
        )
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    model.config.architectures = [type(model).__name__]  # what save_pretrained records (converters read it)
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config  # the weights written are dequantized floats, not GGUF blocks
    model.config.save_pretrained(str(out))
    model.generation_config.save_pretrained(str(out))


def main() -> None:
    if len(sys.argv) != 5:
        sys.exit("usage: vllm-convert-gguf.py MODEL.gguf OUT_DIR DTYPE QUANT")
    gguf, out, dtype, quant = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, torch_dtype=getattr(torch, dtype)
    )
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    out.mkdir(parents=True, exist_ok=True)
    save_weights(model, out)
    tok.save_pretrained(str(out))
    fix_tokenizer(out)
    check_tokenizer(out)
    record = {
        "weights": f"dequantized from {quant} (GGUF {gguf.name}), stored as {dtype}",
        "source": gguf.name,
        "dtype": dtype,
        "quant": quant,
        "converter": "transformers AutoModelForCausalLM/AutoTokenizer.from_pretrained(gguf_file=...) + save_pretrained; "
        "tokenizer set to GPT-2 byte-level BPE, no BOS, eos/pad <|im_end|>",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        # what else the files' bytes depend on (artifact/engines/vllm/conversions.json pins them per converter)
        **{name: _version(name) for name in ("tokenizers", "safetensors", "gguf", "numpy")},
    }
    (out / "conversion.json").write_text(json.dumps(record, indent=1, sort_keys=True))


if __name__ == "__main__":
    main()
