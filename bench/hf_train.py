"""A small random-weight transformers model trained with fa4 and with SDPA: loss curves and tokens/s.

    python3 bench/hf_train.py --family llama --steps 30

The same initial weights, data and optimizer for both attention implementations ("fa4" through
fa4.integrations.transformers, and "sdpa"); bf16 weights, AdamW. Prints both loss curves, their
largest relative gap, and training tokens/s over the steps after the first (compiles and
warm-up excluded). Families: llama (GQA, causal), mistral (sliding window), gemma2 (softcap and
alternating sliding layers), gpt_oss (learnable sinks, sliding layers; small MoE).
"""

from __future__ import annotations

import argparse
import time


def config(family: str, layers: int, seqlen: int):
    import transformers as tf

    base = dict(vocab_size=32000, hidden_size=1024, intermediate_size=2816, num_hidden_layers=layers,
                num_attention_heads=16, num_key_value_heads=4, head_dim=64, max_position_embeddings=max(4096, seqlen),
                attention_dropout=0.0)
    if family == "llama":
        return tf.LlamaConfig(**base)
    if family == "mistral":
        return tf.MistralConfig(**base, sliding_window=seqlen // 4)
    if family == "gemma2":
        return tf.Gemma2Config(**{**base, "head_dim": 128, "num_attention_heads": 8}, sliding_window=seqlen // 4,
                               attn_logit_softcapping=50.0, final_logit_softcapping=30.0, query_pre_attn_scalar=128)
    if family == "gpt_oss":
        return tf.GptOssConfig(**base, sliding_window=seqlen // 4, num_local_experts=4, num_experts_per_tok=2,
                               layer_types=["sliding_attention", "full_attention"] * (layers // 2))
    raise SystemExit(f"unknown family {family!r}")


def train(cfg, impl: str, ids, steps: int):
    import torch
    import transformers as tf

    torch.manual_seed(0)
    model = tf.AutoModelForCausalLM.from_config(cfg, attn_implementation=impl).to(device="cuda", dtype=torch.bfloat16)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    losses, t_start = [], None
    for i in range(steps):
        if i == 1:
            torch.cuda.synchronize()
            t_start = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(input_ids=ids[i % len(ids)], labels=ids[i % len(ids)]).loss
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    torch.cuda.synchronize()
    dt = time.perf_counter() - t_start
    tokens = (steps - 1) * ids[0].numel()
    return [x.item() for x in losses], tokens / dt


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="llama")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--steps", type=int, default=30)
    a = ap.parse_args()
    import torch

    from fa4.integrations import transformers as fa4_hf

    fa4_hf.register()
    cfg = config(a.family, a.layers, a.seqlen)
    g = torch.Generator(device="cuda").manual_seed(1)
    ids = [torch.randint(0, cfg.vocab_size, (a.batch, a.seqlen), device="cuda", generator=g) for _ in range(4)]
    runs = {impl: train(cfg, impl, ids, a.steps) for impl in ("sdpa", "fa4")}
    (ls, tps_s), (lf, tps_f) = runs["sdpa"], runs["fa4"]
    gap = max(abs(x - y) / abs(y) for x, y in zip(lf, ls))
    print(f"{a.family}: {a.layers} layers, B{a.batch} S{a.seqlen}, {a.steps} steps")
    print("step  sdpa      fa4")
    for i in range(0, a.steps, max(1, a.steps // 10)):
        print(f"{i:4d}  {ls[i]:.4f}  {lf[i]:.4f}")
    print(f"final loss sdpa {ls[-1]:.4f} fa4 {lf[-1]:.4f}; largest relative gap over the curve {gap:.4f}")
    print(f"tokens/s sdpa {tps_s:,.0f} fa4 {tps_f:,.0f}: fa4/sdpa {tps_f / tps_s:.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
