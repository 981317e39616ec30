"""The Qwen3 speed-up transform on CPU (tiny configs, seeded random weights): the fused model gives
the eager reference's logits on packed mixed prefill/decode steps, compiled or not; its compiled
functions compile once for every layer (one graph for one token, one for any other count) and never
again as rows come and go; served through the engine it gives transformers' greedy tokens.

Compiles are counted with our own counter (mstar.engine.compile.CompiledFunction). Most tests trace
with dynamo and run the captured graphs through "aot_eager" (no code generation: fast on a shared
CPU); one (`slow`) compiles with inductor, as the GPU server does."""

import random

import pytest
import torch

from mstar.engine.kv.attention import PagedHeads
from mstar.engine.kv.build import build_paged_attention
from mstar.engine.kv.layout import PagedLayout
from mstar.engine.kv.pool import KVGeometry, KVPool
from mstar.models.qwen3.optimize import FusedQwen3, compile_fused, optimize
from tests.llm.engine import TINY, make_node, request, run, tiny_model

CONFIG = TINY.with_changes(num_hidden_layers=3)  # more than two layers share each compile
PAGE = 4
# Two decode rows, a prompt chunk after cached tokens, and a whole prompt: 1 + 1 + 6 + 9 tokens.
MIXED = PagedLayout.build([1, 1, 6, 9], [5, 9, 13, 9], [[0, 1], [2, 3, 4], [5, 6, 7, 8], [9, 10, 11]], PAGE)


@pytest.fixture(autouse=True)
def fresh_dynamo():
    torch._dynamo.reset()  # compiles of other tests share these functions' code objects
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
    torch._dynamo.reset()


def paged_attention(dtype, seed: int = 0):
    pool = KVPool(KVGeometry(CONFIG.num_hidden_layers, 2, 16, dtype, PAGE), 32, "cpu")
    pool.cache.copy_(torch.randn(pool.cache.shape, generator=torch.Generator().manual_seed(seed)))
    return build_paged_attention(pool, PagedHeads(4, 2, 16, dtype, PAGE, 16**-0.5), "torch")


@torch.inference_mode()
def step_logits(model, layout: PagedLayout, dtype) -> torch.Tensor:
    """float32 logits of every token of one step over a seeded pool (cached tokens included)."""
    attention = paged_attention(dtype)
    attention.plan(layout)
    input_ids = torch.arange(layout.total_q) * 37 % CONFIG.vocab_size
    positions = torch.from_numpy(layout.new_positions.copy())
    return model.logits(model(input_ids, positions, attention))


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return float((actual - expected).norm() / expected.norm())


def test_the_fused_model_is_the_eager_model_with_concatenated_projections():
    eager = tiny_model(CONFIG, torch.float32)
    fused = optimize(tiny_model(CONFIG, torch.float32))
    assert isinstance(fused, FusedQwen3) and len(fused.layers) == CONFIG.num_hidden_layers
    layer = fused.layers[0]
    attn = eager.model.layers[0].self_attn
    expected = torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight])
    assert torch.equal(layer.qkv_proj.weight, expected)
    mlp = eager.model.layers[0].mlp
    assert torch.equal(layer.gate_up_proj.weight, torch.cat([mlp.gate_proj.weight, mlp.up_proj.weight]))
    assert fused.lm_head.weight.data_ptr() == fused.embed_tokens.weight.data_ptr()  # still tied
    expected_logits = step_logits(eager, MIXED, torch.float32)
    assert relative_error(step_logits(fused, MIXED, torch.float32), expected_logits) < 1e-6


def test_one_compile_serves_every_layer_and_every_token_count():
    fused = optimize(tiny_model(CONFIG, torch.float32))
    compiled = compile_fused(fused, "default", backend="aot_eager")
    eager = tiny_model(CONFIG, torch.float32)
    for num_tokens in (1, 2):  # as the node's warmup: one token, then any other count
        layout = PagedLayout.build([num_tokens], [num_tokens], [[12]], PAGE)
        step_logits(fused, layout, torch.float32)
    counts = {part.name: part.num_compiles for part in compiled.parts}
    assert len(counts) == 3 and set(counts.values()) == {2}, counts  # not one a layer or a size
    compiled.finish_warmup()
    expected = step_logits(eager, MIXED, torch.float32)
    assert relative_error(step_logits(fused, MIXED, torch.float32), expected) < 1e-6
    for num_tokens in (3, 4, 11):
        pages = list(range(12, 12 + -(-num_tokens // PAGE)))
        step_logits(fused, PagedLayout.build([num_tokens], [num_tokens], [pages], PAGE), torch.float32)
    assert compiled.num_recompiles == 0


@pytest.mark.slow  # inductor's C++ build: tens of seconds on a shared CPU, and it needs a compiler
def test_inductor_compiled_logits_match_the_eager_reference():
    fused = optimize(tiny_model(CONFIG, torch.float32))
    compiled = compile_fused(fused, "deterministic")  # inductor, kernel choices by rule
    eager = tiny_model(CONFIG, torch.float32)
    expected = step_logits(eager, MIXED, torch.float32)
    assert relative_error(step_logits(fused, MIXED, torch.float32), expected) < 1e-5
    assert [part.num_compiles for part in compiled.parts] == [1] * len(compiled.parts)


def test_compile_mode_off_keeps_the_eager_reference():
    from mstar.models.qwen3.nodes import serving_model
    from mstar.models.qwen3.transformer import Qwen3ForCausalLM

    model = tiny_model(CONFIG, torch.float32)
    assert serving_model(model, "off", "cuda") == (model, None)
    assert serving_model(model, "deterministic", "cpu") == (model, None)  # compiling does not pay on CPU
    served, compiled = serving_model(model, "deterministic", "cuda")  # built, not called: no compile
    assert isinstance(served, FusedQwen3) and not isinstance(served, Qwen3ForCausalLM)
    assert [part.mode for part in compiled.parts] == ["deterministic"] * 3
    with pytest.raises(ValueError, match="off"):
        compile_fused(optimize(tiny_model(CONFIG, torch.float32)), "off")


def transformers_greedy(eager, prompt_ids: list[int], num_tokens: int) -> list[int]:
    transformers = pytest.importorskip("transformers")
    hf = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**CONFIG.to_hf())).double().eval()
    hf.load_state_dict({**eager.state_dict(), "lm_head.weight": eager.lm_head.weight}, strict=True)
    hf.generation_config.eos_token_id = None
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt_ids]), max_new_tokens=num_tokens, min_new_tokens=num_tokens,
            do_sample=False, pad_token_id=0,
        )  # fmt: skip
    return out[0, len(prompt_ids) :].tolist()


def test_served_with_the_transform_greedy_tokens_equal_transformers_generate():
    """The node over the fused, compiled model: its warmup compiles (one token, two, the largest
    step), and requests of 1 to 6 rows joining and leaving compile nothing more."""
    rng = random.Random(0)
    prompts = [[rng.randrange(CONFIG.vocab_size) for _ in range(rng.randint(3, 30))] for _ in range(6)]
    eager = tiny_model(CONFIG)
    fused = optimize(tiny_model(CONFIG))
    compiled = compile_fused(fused, "default", backend="aot_eager")
    node = make_node(fused, CONFIG, compiled=compiled, max_num_seqs=6, max_num_batched_tokens=24)
    node.warmup()
    assert [part.num_compiles for part in compiled.parts] == [2] * 3
    joins = [0, 0, 3, 5, 9, 20]
    ours, _, _ = run(node, [request(p, 24) for p in prompts], joins)
    for prompt, tokens in zip(prompts, ours, strict=True):
        assert tokens == transformers_greedy(eager, prompt, 24)
    assert node.num_recompiles() == 0
