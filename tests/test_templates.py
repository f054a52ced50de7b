"""The built-in templates: exact parameter counts against the reference implementations, cheap meta builds,
shapes, size checks, and (where transformers is installed) the same function as the Hugging Face models."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.core.errors import UserError
from engine.models.templates import TEMPLATES, bert, gpt2, llama

# Published parameter counts of the reference implementations.
#  - torchvision: the `num_params` of each model's ImageNet weights in torchvision.models
#    (docs "Classification" table / weights meta), e.g. ResNet18_Weights.IMAGENET1K_V1 = 11,689,512.
#  - Hugging Face: BertModel(bert-base-uncased) with pooler 109,482,240; bert-large-uncased 335,141,888;
#    GPT2Model / GPT2LMHeadModel (tied head) gpt2 124,439,808, gpt2-medium 354,823,168;
#    LlamaForCausalLM for the LLaMA-2 7B / 13B / 70B configs (Touvron et al. 2023, table 1 shapes).
#  - unet and lstm-lm have no published count: they are derived layer by layer below from their papers.
PUBLISHED = {
    "resnet18": 11_689_512,
    "resnet34": 21_797_672,
    "resnet50": 25_557_032,
    "resnet101": 44_549_160,
    "resnet152": 60_192_808,
    "vgg16": 138_357_544,
    "mobilenet_v2": 3_504_872,
    "vit-b16": 86_567_656,
    "bert-base": 109_482_240,
    "bert-large": 335_141_888,
    "gpt2": 124_439_808,
    "gpt2-medium": 354_823_168,
    "llama-7b": 6_738_415_616,
    "llama-13b": 13_015_864_320,
    "llama-70b": 68_976_648_192,
}


def n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights are counted once


def meta_build(name: str, batch: int = 2, seq_len=None, image_size=None):
    with torch.device("meta"):
        return TEMPLATES[name].build(batch, seq_len, image_size)


def unet_paper_count() -> int:
    """Ronneberger et al. 2015, fig. 1: 3x3 convs (+bias), 2x2 up-convs halving channels, 1x1 to 2 classes."""
    conv3 = lambda i, o: 9 * i * o + o  # noqa: E731
    double = lambda i, o: conv3(i, o) + conv3(o, o)  # noqa: E731
    widths = [64, 128, 256, 512, 1024]
    total = double(1, 64) + sum(double(a, b) for a, b in zip(widths, widths[1:], strict=False))
    for hi, lo in zip(widths[:0:-1], widths[-2::-1], strict=False):
        total += 4 * hi * lo + lo + double(2 * lo, lo)
    return total + 64 * 2 + 2


def lstm_lm_paper_count() -> int:
    """PyTorch word_language_model defaults (emsize = nhid = 200, 2 layers, untied) on WikiText-2's
    33,278-word vocabulary; an LSTM layer holds W_ih (4h x in), W_hh (4h x h) and two 4h biases (torch docs)."""
    v, e, h = 33_278, 200, 200
    lstm = sum(4 * h * (i + h) + 8 * h for i in (e, h))
    return v * e + lstm + h * v + v


def test_registry_has_exactly_the_required_templates():
    assert set(TEMPLATES) == set(PUBLISHED) | {"unet", "lstm-lm"}
    for name, info in TEMPLATES.items():
        assert info.name == name
        assert info.family in ("vision", "text")
        assert (info.default_seq_len is None) == (info.family == "vision")
        assert (info.default_image_size is None) == (info.family == "text")


@pytest.mark.parametrize("name", sorted(TEMPLATES))
def test_meta_build_has_the_reference_parameter_count(name):
    expected = PUBLISHED.get(name) or {"unet": unet_paper_count(), "lstm-lm": lstm_lm_paper_count()}[name]
    model, _ = meta_build(name)
    assert all(p.device.type == "meta" for p in model.parameters())
    assert n_params(model) == expected == TEMPLATES[name].reference_parameters


def test_derived_counts():
    assert unet_paper_count() == 31_030_658
    assert lstm_lm_paper_count() == 13_987_678


def test_llama_70b_builds_on_meta_without_real_storage():
    # what keeps a 70B build cheap: no parameter, buffer or input holds real memory (timings live in benchmarks/)
    model, inputs = meta_build("llama-70b", batch=1)
    assert n_params(model) == 68_976_648_192
    assert inputs["input_ids"].shape == (1, 2048) and inputs["input_ids"].device.type == "meta"
    assert all(t.device.type == "meta" for t in [*model.parameters(), *model.buffers()])


# Larger siblings (resnet101/152, bert-large, gpt2-medium, llama-13b) run the same code: left out for speed.
FORWARD_CHECKED = sorted(set(TEMPLATES) - {"resnet101", "resnet152", "bert-large", "gpt2-medium", "llama-13b"})


@pytest.mark.parametrize("name", FORWARD_CHECKED)
def test_forward_on_meta_gives_the_expected_output(name):
    info = TEMPLATES[name]
    small = {"seq_len": 16} if info.family == "text" else {"image_size": 64}
    model, inputs = meta_build(name, batch=3, **small)
    with torch.device("meta"):
        out = model(**inputs) if isinstance(inputs, dict) else model(inputs)
    if name == "unet":
        assert out.shape == (3, 2, 64, 64)
    elif info.family == "vision":
        assert out.shape == (3, 1000)
    elif name.startswith("bert"):
        hidden = 768 if name == "bert-base" else 1024
        assert out[0].shape == (3, 16, hidden) and out[1].shape == (3, hidden)
    else:  # language models: a scalar loss for labels, logits over the vocabulary
        assert out.loss.shape == () and out["logits"].shape[:2] == (3, 16)


def test_repeated_blocks_live_in_containers_of_one_type():
    # The tracer checkpoints children of ModuleList/Sequential containers holding >= 2 modules of one type.
    for name in TEMPLATES:
        if name == "lstm-lm":  # one nn.LSTM module: nothing to repeat
            continue
        model, _ = meta_build(name)
        found = [
            m for m in model.modules()
            if isinstance(m, (nn.ModuleList, nn.Sequential)) and len(m) >= 2
            and len({type(c) for c in m}) == 1 and any(True for _ in m.parameters())
        ]
        assert found, name


def test_sizes_override_defaults():
    _, x = meta_build("resnet50", batch=4)
    assert x.shape == (4, 3, 224, 224)
    _, x = meta_build("unet", batch=2)
    assert x.shape == (2, 1, 256, 256)
    _, x = meta_build("gpt2", batch=2, seq_len=128)
    assert x["input_ids"].shape == (2, 128) and x["input_ids"].dtype == torch.long
    # torchvision's ViT_B_16_Weights.IMAGENET1K_SWAG_E2E_V1 (384x384 positions) publishes 86,859,496.
    model, x = meta_build("vit-b16", batch=1, image_size=384)
    assert x.shape == (1, 3, 384, 384) and n_params(model) == 86_859_496


@pytest.mark.parametrize("name, kw, words", [
    ("gpt2", {"seq_len": 2048}, "between 1 and 1024"),
    ("bert-base", {"seq_len": 513}, "between 1 and 512"),
    ("vit-b16", {"image_size": 100}, "multiple of 16"),
    ("unet", {"image_size": 100}, "multiple of 16"),
    ("resnet18", {"image_size": 8}, "at least 32"),
])
def test_sizes_that_do_not_fit_are_user_errors(name, kw, words):
    with pytest.raises(UserError, match=words) as err:
        meta_build(name, **kw)
    assert name in str(err.value) and "\n" not in str(err.value)


def test_small_templates_train_for_real_on_cpu():
    torch.manual_seed(0)
    model, inputs = TEMPLATES["lstm-lm"].build(2, 8, None)
    out = model(**inputs)
    # At initialisation the next-token loss is close to ln(vocabulary) = ln(33,278) = 10.41.
    assert abs(out.loss.item() - 10.41) < 0.2
    out.loss.backward()
    assert model.encoder.weight.grad is not None
    model, x = TEMPLATES["resnet18"].build(2, None, 32)
    assert model(x).shape == (2, 1000)


# --- Against Hugging Face transformers (random weights; on meta for the full sizes) --------------------------

try:
    import transformers
except ImportError:  # an optional dev dependency: only these comparisons need it
    transformers = None

needs_hf = pytest.mark.skipif(transformers is None, reason="transformers is not installed")


def hf_full(name: str) -> nn.Module:
    t = transformers
    configs = {
        "bert-base": lambda: t.BertModel(t.BertConfig()),
        "bert-large": lambda: t.BertModel(t.BertConfig(hidden_size=1024, num_hidden_layers=24,
                                                       num_attention_heads=16, intermediate_size=4096)),
        "gpt2": lambda: t.GPT2LMHeadModel(t.GPT2Config()),
        "gpt2-medium": lambda: t.GPT2LMHeadModel(t.GPT2Config(n_embd=1024, n_layer=24, n_head=16)),
        "llama-7b": lambda: t.LlamaForCausalLM(_llama_cfg(4096, 11008, 32, 32, 32)),
        "llama-13b": lambda: t.LlamaForCausalLM(_llama_cfg(5120, 13824, 40, 40, 40)),
        "llama-70b": lambda: t.LlamaForCausalLM(_llama_cfg(8192, 28672, 80, 64, 8)),
    }
    with torch.device("meta"):
        return configs[name]()


def _llama_cfg(hidden, inter, layers, heads, kv_heads, vocab=32000):
    return transformers.LlamaConfig(hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                                    num_attention_heads=heads, num_key_value_heads=kv_heads, vocab_size=vocab,
                                    rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False)


@needs_hf
@pytest.mark.parametrize("name", ["bert-base", "bert-large", "gpt2", "gpt2-medium",
                                  "llama-7b", "llama-13b", "llama-70b"])
def test_count_equals_transformers_model_built_on_meta(name):
    ours, _ = meta_build(name, batch=1)
    assert n_params(ours) == n_params(hf_full(name)) == PUBLISHED[name]


def _load_from_hf(ours: nn.Module, hf: nn.Module, rename, transpose=()) -> None:
    """Copy HF weights into our template by name; every one of our parameters must be covered."""
    state = {}
    for k, v in hf.state_dict().items():
        k = rename(k)
        if any(t in k for t in transpose) and v.dim() == 2:
            v = v.t()  # GPT-2's Conv1D stores (in, out)
        state[k] = v
    wanted = ours.state_dict()
    missing = set(wanted) - set(state)
    assert not missing, missing
    ours.load_state_dict({k: state[k] for k in wanted})


@needs_hf
def test_gpt2_computes_what_transformers_computes():
    torch.manual_seed(0)
    c = gpt2.GPT2Config(hidden=64, layers=2, heads=4, vocab_size=100, max_positions=32)
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(
        n_embd=64, n_layer=2, n_head=4, vocab_size=100, n_positions=32, attn_implementation="sdpa")).eval()
    ours = gpt2.GPT2LMHeadModel(c).eval()
    _load_from_hf(ours, hf, lambda k: k.removeprefix("transformer."), transpose=("c_attn", "c_proj", "c_fc"))
    ids = torch.randint(0, 100, (2, 16))
    want, got = hf(input_ids=ids, labels=ids), ours(input_ids=ids, labels=ids)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got.loss, want.loss, atol=1e-5, rtol=1e-4)


@needs_hf
def test_llama_with_grouped_kv_heads_computes_what_transformers_computes():
    torch.manual_seed(0)
    c = llama.LlamaConfig(hidden=64, layers=2, heads=8, kv_heads=2, intermediate=96, vocab_size=100)
    hf = transformers.LlamaForCausalLM(_llama_cfg(64, 96, 2, 8, 2, vocab=100)).eval()
    ours = llama.LlamaForCausalLM(c).eval()
    _load_from_hf(ours, hf, lambda k: k.removeprefix("model."))
    ids = torch.randint(0, 100, (2, 16))
    want, got = hf(input_ids=ids, labels=ids), ours(input_ids=ids, labels=ids)
    torch.testing.assert_close(got.logits, want.logits, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got.loss, want.loss, atol=1e-5, rtol=1e-4)


@needs_hf
def test_bert_computes_what_transformers_computes():
    torch.manual_seed(0)
    c = bert.BertConfig(hidden=64, layers=2, heads=4, intermediate=128, vocab_size=100, max_positions=32)
    hf = transformers.BertModel(transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, vocab_size=100,
        max_position_embeddings=32)).eval()
    ours = bert.BertModel(c).eval()

    def rename(k: str) -> str:
        return (k.removeprefix("encoder.").replace("intermediate.dense.", "intermediate.")
                .replace("pooler.dense.", "pooler."))

    _load_from_hf(ours, hf, rename)
    ids = torch.randint(0, 100, (2, 16))
    want, got = hf(input_ids=ids), ours(input_ids=ids)
    torch.testing.assert_close(got[0], want.last_hidden_state, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(got[1], want.pooler_output, atol=1e-5, rtol=1e-4)
