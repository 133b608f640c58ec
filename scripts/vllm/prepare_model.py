"""A Hugging Face checkpoint (safetensors and tokenizer) made from one of the catalog's pinned GGUF
files, for vLLM to serve: run with the vLLM environment's Python (scripts/vllm/env.sh), never the
project's.

Why convert rather than hand vLLM the GGUF: vLLM 0.32 moved GGUF loading out of its tree into
`vllm-gguf-plugin`, whose kernels are CUDA/ROCm only, and this machine reaches no model hub for
the original checkpoint. transformers reads the GGUF itself (`gguf_file=`): its tensors dequantized
to float32 (Q4_K and Q6_K blocks expand exactly: every value is a float16 scale times a small
integer plus a float16 minimum, all exact in float32) and its tokenizer and chat template rebuilt
from the GGUF's metadata. So the weights vLLM serves are the 4-bit model's weights, not the
original model's; what vLLM then computes differs from llama.cpp only by arithmetic (llama.cpp
multiplies the 4-bit blocks with 8-bit quantised activations; vLLM, the float32 or bfloat16 copy).

Reproducible and checked: the GGUF is verified against the catalog's pin before it is parsed, and
every file written is hashed; `--expect FILE` (the committed list, `<name>.sha256`) refuses an
output that differs, so two machines serve the same bytes. The output directory is replaced only
when complete (written beside it, then renamed).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from pathlib import Path


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def digests(folder: Path) -> dict[str, str]:
    return {p.name: sha256(p) for p in sorted(folder.iterdir()) if p.is_file() and p.name != "SHA256SUMS"}


def convert(gguf: Path, gguf_sha256: str, out: Path) -> dict[str, str]:
    # the pin first, before the parser (transformers' GGUF reader, then Jinja for the template)
    # is even imported: a file that is not the pinned one never reaches code that parses it
    got = sha256(gguf)
    if got != gguf_sha256:
        raise SystemExit(f"{gguf}: sha256 {got}, not the pinned {gguf_sha256}: refused")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    work = out.with_name(out.name + ".partial")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    from safetensors.torch import save_file
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    # transformers marks a model read from GGUF as quantized and will not save it; its tensors are
    # plain float32 by now, so they are written directly, and the config without the marker
    state = {k: v.contiguous() for k, v in model.state_dict().items()}
    if model.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # the same tensor as the embedding: vLLM ties it back
    save_file(dict(sorted(state.items())), str(work / "model.safetensors"), metadata={"format": "pt"})
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    # unset when read from GGUF; without it vLLM resolves the bare `Qwen2Model` (no LM head)
    config.architectures = [type(model).__name__]
    config.save_pretrained(str(work))
    model.generation_config.save_pretrained(str(work))
    tok.save_pretrained(str(work))
    sums = digests(work)
    (work / "SHA256SUMS").write_text("".join(f"{v}  {k}\n" for k, v in sums.items()))
    shutil.rmtree(out, ignore_errors=True)
    os.replace(work, out)
    return sums


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gguf", type=Path, required=True, help="the pinned GGUF file")
    parser.add_argument("--gguf-sha256", required=True, help="its pinned sha256 (the catalog's)")
    parser.add_argument("--out", type=Path, required=True, help="the checkpoint directory to write")
    parser.add_argument("--expect", type=Path, help="committed sha256 list the output must match")
    args = parser.parse_args()
    sums_file = args.out / "SHA256SUMS"
    if sums_file.is_file() and digests(args.out) == _read(sums_file):
        sums = _read(sums_file)
        print(f"{args.out}: already prepared")
    else:
        sums = convert(args.gguf, args.gguf_sha256, args.out)
        print(f"{args.out}: written from {args.gguf.name}")
    if args.expect is not None:
        want = _read(args.expect)
        if sums != want:
            diff = {k: (sums.get(k), want.get(k)) for k in sorted(set(sums) | set(want)) if sums.get(k) != want.get(k)}
            print(json.dumps(diff, indent=1), file=sys.stderr)
            raise SystemExit(f"{args.out} differs from {args.expect}: refused (see above)")
    return 0


def _read(path: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            out[name.strip()] = digest
    return out


if __name__ == "__main__":
    sys.exit(main())
