"""A transformers Qwen3 folder served as `--model-path` (CPU, tiny widths): transformers writes it
with `save_pretrained` (weights, config, generation config) beside a real tokenizer folder with its
chat template (tiny-chat's), and our LLM node built from it the way the worker builds it answers
each chat prompt with transformers' greedy `generate` tokens on the same folder."""

import shutil
from pathlib import Path

import pytest
import torch

from mstar.config import ServerConfig
from mstar.graph import BuildContext
from mstar.llm.params import TextRequest, TextSampling
from mstar.models.qwen3.model import Qwen3Spec
from mstar.models.tiny_chat.model import TinyChatSpec
from tests.llm.engine import run

NUM_NEW_TOKENS = 12
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
CHATS = [
    [{"role": "user", "content": "What is 12 + 30?"}],
    [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "and 7 * 6?"}],
]
MIN_TOP_GAP = 1e-2  # between the best two logits at every generated position (fp32 runs at ~1e-5)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    transformers = pytest.importorskip("transformers")
    tokenizer_dir = TinyChatSpec.weights_dir
    path = tmp_path_factory.mktemp("qwen3-folder")
    torch.manual_seed(0)
    config = transformers.Qwen3Config(
        vocab_size=384, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, max_position_embeddings=256, tie_word_embeddings=False,
        initializer_range=0.2, bos_token_id=0, eos_token_id=2,
    )  # fmt: skip
    transformers.Qwen3ForCausalLM(config).save_pretrained(path)
    for name in TOKENIZER_FILES:
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, path / name)
    return path


def _transformers_greedy(folder: Path, prompt_ids: list[int]) -> tuple[list[int], float]:
    """Greedy tokens of transformers on the folder (float64, EOS ignored), and the smallest gap
    between the best two logits over them."""
    import transformers

    hf = transformers.Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float64).eval()
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt_ids]), max_new_tokens=NUM_NEW_TOKENS, min_new_tokens=NUM_NEW_TOKENS,
            do_sample=False, eos_token_id=None, pad_token_id=0, output_logits=True, return_dict_in_generate=True,
        )  # fmt: skip
    gaps = [float(top[0] - top[1]) for top in (step[0].topk(2).values for step in out.logits)]
    return out.sequences[0, len(prompt_ids) :].tolist(), min(gaps)


@pytest.fixture
def one_thread_while_it_runs():
    """The node's build sets torch to one thread, as a worker does; the rest of the run gets back
    its thread count."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_a_transformers_folder_serves_transformers_greedy_tokens(folder, one_thread_while_it_runs):
    import transformers

    server = ServerConfig(model="qwen3", model_path=str(folder), compile_mode="off", kv_pool_pages=64)
    spec = Qwen3Spec()
    node = spec.build_nodes(BuildContext(server, "cpu", spec.node_names, model_path=str(folder)))["llm"]
    ours_tokenizer = spec.load_tokenizer(server)
    theirs_tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    assert spec.context_length(server) == 256  # from the folder's config
    for chat in CHATS:
        text = ours_tokenizer.render_chat(chat, add_generation_prompt=True)
        prompt_ids = ours_tokenizer.encode(text)
        theirs = theirs_tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_dict=True)
        assert prompt_ids == list(theirs["input_ids"])
        expected, gap = _transformers_greedy(folder, prompt_ids)
        assert gap > MIN_TOP_GAP  # no near tie that float32 could break either way
        sampling = TextSampling(max_tokens=NUM_NEW_TOKENS, ignore_eos=True, temperature=0.0)
        (ours,), _, _ = run(node, [TextRequest(prompt_ids, sampling, stream=True)])
        assert ours == expected
