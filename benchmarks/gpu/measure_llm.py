"""On a CUDA machine: real figures for today's LLM workloads and for the CUDA context, the ground truth that the
estimates of generation (KV cache), LoRA/QLoRA, 8-bit weights and optimizers and mixture-of-experts are checked
against (benchmarks/gpu_compare.py reads the JSON this writes). Each case runs in a fresh process; it measures
only (no VRAMScope code), so the figures stay valid whatever the estimator later becomes.

    python benchmarks/gpu/measure_llm.py OUT.json [--time-limit SECONDS] [--kinds KIND,...] [--smoke]

Models are small Hugging Face configurations with random weights (no download). `--smoke` runs tiny versions on the
CPU to check the script itself.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

LLAMA = dict(hidden_size=1024, intermediate_size=2816, num_hidden_layers=8, num_attention_heads=16,
             num_key_value_heads=4, vocab_size=32000, max_position_embeddings=4096, rms_norm_eps=1e-5,
             tie_word_embeddings=False)
MIXTRAL = dict(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
               num_key_value_heads=2, vocab_size=32000, num_local_experts=8, num_experts_per_tok=2,
               max_position_embeddings=4096, tie_word_embeddings=False)

# (name, kind, settings)
CASES = [
    ("context stages", "context", {}),
    ("llama-small generate dynamic bf16 b4 p512 n128", "generate",
     dict(config=LLAMA, dtype="bf16", batch=4, prompt=512, new=128, cache="dynamic")),
    ("llama-small generate static bf16 b4 p512 n128", "generate",
     dict(config=LLAMA, dtype="bf16", batch=4, prompt=512, new=128, cache="static")),
    ("llama-small mqa generate dynamic fp16 b8 p1024 n64", "generate",
     dict(config={**LLAMA, "num_key_value_heads": 1}, dtype="fp16", batch=8, prompt=1024, new=64, cache="dynamic")),
    ("llama-small lora r16 qkvo bf16 adamw b4 s512", "lora",
     dict(config=LLAMA, dtype="bf16", batch=4, seq=512, rank=16, alpha=32,
          targets=["q_proj", "k_proj", "v_proj", "o_proj"], amp=False)),
    ("llama-small lora r8 all-linear fp32+amp-bf16 adamw b4 s512", "lora",
     dict(config=LLAMA, dtype="fp32", batch=4, seq=512, rank=8, alpha=16, targets="all-linear", amp=True)),
    ("llama-small qlora nf4 dq r16 qv bf16 adamw b4 s512", "qlora",
     dict(config=LLAMA, batch=4, seq=512, rank=16, alpha=32, targets=["q_proj", "v_proj"], quant="nf4")),
    ("llama-small int8 weights inference fp16 b4 s512", "int8", dict(config=LLAMA, batch=4, seq=512)),
    ("llama-small full bf16 adamw8bit b4 s512", "optim8", dict(config=LLAMA, batch=4, seq=512, paged=False)),
    ("llama-small full bf16 paged-adamw8bit b4 s512", "optim8", dict(config=LLAMA, batch=4, seq=512, paged=True)),
    ("mixtral-tiny 8x top2 fp32 adamw b4 s256", "moe", dict(config=MIXTRAL, batch=4, seq=256)),
]

CHILD = r'''
import json, sys, time, torch
kind, s, smoke = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3] == "1"
dev = "cpu" if smoke else "cuda"
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
res = {}
def mem():
    return torch.cuda.memory_allocated() if dev == "cuda" else 0
def peak():
    return torch.cuda.max_memory_allocated() if dev == "cuda" else 0
def reset():
    if dev == "cuda":
        torch.cuda.synchronize(); torch.cuda.reset_peak_memory_stats()
def nvml_used():
    if dev != "cuda":
        return None
    import pynvml
    pynvml.nvmlInit()
    h = pynvml.nvmlDeviceGetHandleByIndex(torch.cuda.current_device())
    return pynvml.nvmlDeviceGetMemoryInfo(h).used
def shrink(c):
    if smoke:
        c = dict(c); c.update(hidden_size=64, intermediate_size=128, num_hidden_layers=2, vocab_size=256)
        c["num_attention_heads"] = 4; c["num_key_value_heads"] = min(c.get("num_key_value_heads", 4), 2)
    return c
def llama(c, dtype):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(**shrink(c))
    torch.manual_seed(0)
    m = LlamaForCausalLM(cfg).to(DT[dtype])
    res["attn_implementation"] = m.config._attn_implementation
    res["config"] = cfg.to_dict()
    return m
def quantize_linears(m, make):
    """Every Linear but the output head replaced by make(linear) (a bitsandbytes layer holding its weight)."""
    names = [n for n, mod in m.named_modules() if isinstance(mod, torch.nn.Linear) and n != "lm_head"]
    for n in names:
        parent, _, leaf = n.rpartition(".")
        p = m.get_submodule(parent)
        setattr(p, leaf, make(getattr(p, leaf)))
def ids(b, t, vocab):
    return torch.randint(0, vocab, (b, t), device=dev)
def train_steps(model, opt, batch, amp_dtype=None, steps=2):
    for _ in range(steps):
        ctx = torch.autocast(dev, dtype=amp_dtype) if amp_dtype is not None else torch.autocast(dev, enabled=False)
        with ctx:
            out = model(input_ids=batch, labels=batch)
        loss = out.loss
        del out
        loss.backward()
        opt.step(); opt.zero_grad(set_to_none=True)
        del loss

if kind == "context":
    if smoke:
        print(json.dumps({"skipped": "no GPU"})); sys.exit(0)
    stages = []
    def stage(name):
        torch.cuda.synchronize()
        stages.append({"stage": name, "nvml_used": nvml_used(), "reserved": torch.cuda.memory_reserved(),
                       "allocated": torch.cuda.memory_allocated()})
    stage("before init")
    torch.cuda.init(); x = torch.ones(1, device="cuda"); stage("context (first tensor)")
    a = torch.randn(1024, 1024, device="cuda"); (a @ a).sum().item(); stage("first fp32 matmul (cuBLAS)")
    b = a.bfloat16(); (b @ b).sum().item(); stage("first bf16 matmul (cuBLASLt)")
    conv = torch.nn.Conv2d(64, 64, 3, padding=1).cuda(); conv(torch.randn(8, 64, 56, 56, device="cuda")).sum().item(); stage("first convolution (cuDNN)")
    q = torch.randn(4, 16, 512, 64, device="cuda", dtype=torch.bfloat16)
    torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True).sum().item(); stage("first bf16 attention")
    lstm = torch.nn.LSTM(256, 256, batch_first=True).cuda(); lstm(torch.randn(4, 32, 256, device="cuda"))[0].sum().item(); stage("first LSTM (cuDNN RNN)")
    res["stages"] = stages
    res["gpu"] = torch.cuda.get_device_name(0); res["torch"] = torch.__version__; res["cuda"] = torch.version.cuda
    res["cudnn"] = torch.backends.cudnn.version()
elif kind == "generate":
    m = llama(s["config"], s["dtype"]).to(dev).eval()
    res["weights"] = mem()
    vocab = m.config.vocab_size
    prompt = ids(s["batch"], s["prompt"] if not smoke else 16, vocab)
    new = s["new"] if not smoke else 4
    with torch.no_grad():
        # the manual loop (prefill, then one token at a time with the model's own cache)
        if s["cache"] == "dynamic":
            reset(); out = m(input_ids=prompt, use_cache=True)
            res["prefill_peak"] = peak(); cache = out.past_key_values
            nxt = out.logits[:, -1:].argmax(-1); del out
            res["after_prefill"] = mem()
            reset()
            for _ in range(new - 1):
                out = m(input_ids=nxt, past_key_values=cache, use_cache=True)
                cache = out.past_key_values; nxt = out.logits[:, -1:].argmax(-1); del out
            res["decode_peak"] = peak(); res["after_decode"] = mem()
            del cache, nxt
        # generate() itself
        reset(); base = mem()
        kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
        if s["cache"] == "static":
            kw["cache_implementation"] = "static"
        t0 = time.time(); g = m.generate(prompt, **kw)
        res["generate_seconds"] = round(time.time() - t0, 2)
        res["generate_peak"] = peak(); res["generate_base"] = base; res["generated"] = list(g.shape)
elif kind in ("lora", "qlora"):
    from peft import LoraConfig, get_peft_model
    if kind == "qlora":
        import bitsandbytes as bnb
        m = llama(s["config"], "bf16")
        def four_bit(lin):
            q = bnb.nn.Linear4bit(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                  compute_dtype=torch.bfloat16, compress_statistics=True, quant_type=s["quant"])
            q.weight = bnb.nn.Params4bit(lin.weight.data, requires_grad=False, compress_statistics=True,
                                         quant_type=s["quant"])
            return q
        quantize_linears(m, four_bit)
        if smoke:
            print(json.dumps({"skipped": "bitsandbytes 4-bit needs CUDA here"})); sys.exit(0)
        m = m.to(dev)
    else:
        m = llama(s["config"], s["dtype"]).to(dev)
    res["base_weights"] = mem()
    lc = LoraConfig(r=s["rank"], lora_alpha=s["alpha"], target_modules=s["targets"], lora_dropout=0.0,
                    bias="none", task_type="CAUSAL_LM")
    m = get_peft_model(m, lc); m.train()
    res["trainable_params"] = sum(p.numel() for p in m.parameters() if p.requires_grad)
    res["all_params"] = sum(p.numel() for p in m.parameters())
    res["with_adapters"] = mem()
    opt = torch.optim.AdamW([p for p in m.parameters() if p.requires_grad], lr=1e-4)
    batch = ids(s["batch"], s["seq"] if not smoke else 16, m.config.vocab_size)
    reset(); res["before_steps"] = mem()
    train_steps(m, opt, batch, torch.bfloat16 if s.get("amp") else None)
    res["peak"] = peak(); res["after_steps"] = mem()
elif kind == "int8":
    import bitsandbytes as bnb
    m = llama(s["config"], "fp16")
    def eight_bit(lin):
        q = bnb.nn.Linear8bitLt(lin.in_features, lin.out_features, bias=lin.bias is not None,
                                has_fp16_weights=False, threshold=6.0)
        q.weight = bnb.nn.Int8Params(lin.weight.data, requires_grad=False, has_fp16_weights=False)
        return q
    quantize_linears(m, eight_bit)
    if smoke:
        print(json.dumps({"skipped": "bitsandbytes 8-bit needs CUDA here"})); sys.exit(0)
    m = m.to(dev).eval(); res["weights"] = mem()
    batch = ids(s["batch"], s["seq"], m.config.vocab_size)
    reset()
    with torch.no_grad():
        out = m(input_ids=batch, use_cache=False); del out
    res["peak"] = peak(); res["after"] = mem()
elif kind == "optim8":
    import bitsandbytes as bnb
    m = llama(s["config"], "bf16").to(dev).train()
    if smoke:
        print(json.dumps({"skipped": "bitsandbytes 8-bit optimizers need CUDA here"})); sys.exit(0)
    res["weights"] = mem()
    cls = bnb.optim.PagedAdamW8bit if s["paged"] else bnb.optim.AdamW8bit
    opt = cls(m.parameters(), lr=1e-4)
    batch = ids(s["batch"], s["seq"], m.config.vocab_size)
    reset(); train_steps(m, opt, batch)
    res["peak"] = peak(); res["after_steps"] = mem()
    res["state_bytes_on_device"] = sum(v.numel() * v.element_size() for st in opt.state.values()
                                       for v in st.values() if torch.is_tensor(v) and v.device.type == "cuda")
    res["state_bytes_all"] = sum(v.numel() * v.element_size() for st in opt.state.values()
                                 for v in st.values() if torch.is_tensor(v))
elif kind == "moe":
    from transformers import MixtralConfig, MixtralForCausalLM
    cfg = MixtralConfig(**shrink(s["config"]))
    torch.manual_seed(0)
    m = MixtralForCausalLM(cfg).to(dev).train()
    res["config"] = cfg.to_dict(); res["attn_implementation"] = m.config._attn_implementation
    res["weights"] = mem()
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    batch = ids(s["batch"], s["seq"] if not smoke else 16, cfg.vocab_size)
    reset(); train_steps(m, opt, batch)
    res["peak"] = peak(); res["after_steps"] = mem()
if dev == "cuda":
    res["max_reserved"] = torch.cuda.max_memory_reserved(); res["nvml_used"] = nvml_used()
res["torch"] = torch.__version__
import transformers; res["transformers"] = transformers.__version__
print(json.dumps(res))
'''


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    smoke = "--smoke" in argv
    limit = float(argv[argv.index("--time-limit") + 1]) if "--time-limit" in argv else 300.0
    kinds = set(argv[argv.index("--kinds") + 1].split(",")) if "--kinds" in argv else None
    t_start = time.time()
    rows = []
    for name, kind, settings in CASES:
        if kinds is not None and kind not in kinds:
            continue
        left = limit - (time.time() - t_start)
        if left < 15:
            rows.append({"case": name, "kind": kind, "settings": settings, "error": "skipped for time"})
            continue
        try:
            p = subprocess.run([sys.executable, "-c", CHILD, kind, json.dumps(settings), "1" if smoke else "0"],
                               capture_output=True, text=True, timeout=min(120.0, left))
            line = (p.stdout.strip().splitlines() or [""])[-1]
            got = json.loads(line) if p.returncode == 0 and line.startswith("{") else {
                "error": (p.stderr.strip().splitlines() or ["no output"])[-1][:300]}
        except subprocess.TimeoutExpired:
            got = {"error": "time limit"}
        rows.append({"case": name, "kind": kind, "settings": settings, **got})
        print(name, "->", json.dumps(got)[:400], flush=True)
        out.write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
