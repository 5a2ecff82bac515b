"""A Hugging Face transformers Llama training step on fa4, its attention problems recorded.

    python3 bench/llama_step.py --out llama_shapes.json      # then: fa4-tune --shapes llama_shapes.json

Random weights (no download): a Llama-3-style decoder (GQA 32/8 query/key-value heads, head_dim
128, RoPE) with few layers, so one step fits in seconds. fa4 is registered as a transformers
attention implementation (fa4.integrations.transformers); every layer's attention runs
fa4.flash_attn_func (forward and, through autograd, our backward), and ``fa4.record_shapes`` writes each distinct problem with its call
count and GPU time share. The first step warms up (kernel compiles) outside the recording.
"""

from __future__ import annotations

import argparse
import json
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="llama_shapes.json")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seqlen", type=int, default=4096)
    ap.add_argument("--steps", type=int, default=2, help="recorded steps after the warm-up step")
    a = ap.parse_args()

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import fa4
    from fa4.integrations import transformers as fa4_hf

    fa4_hf.register()
    cfg = LlamaConfig(vocab_size=32000, hidden_size=4096, intermediate_size=14336, num_hidden_layers=a.layers,
                      num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                      max_position_embeddings=max(8192, a.seqlen), rope_theta=500000.0)
    cfg._attn_implementation = "fa4"
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).to(device="cuda", dtype=torch.bfloat16)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=1e-4)
    ids = torch.randint(0, cfg.vocab_size, (a.batch, a.seqlen), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        return loss

    t0 = time.perf_counter()
    first = step().item()
    torch.cuda.synchronize()
    print(f"warm-up step: loss {first:.3f}, {time.perf_counter() - t0:.1f} s (compiles included)", flush=True)
    with fa4.record_shapes(a.out):
        t0 = time.perf_counter()
        for _ in range(a.steps):
            loss = step()
        torch.cuda.synchronize()
        dt = (time.perf_counter() - t0) / a.steps
    print(f"recorded {a.steps} steps: loss {loss.item():.3f}, {dt * 1e3:.0f} ms per step", flush=True)
    rec = json.load(open(a.out))
    for s in rec["shapes"]:
        print("SHAPE " + json.dumps(s), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
