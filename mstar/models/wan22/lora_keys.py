"""Wan2.2's LoRA key layouts (torch-free): original-checkpoint module names as diffusers renames
them (`_convert_non_diffusers_wan_lora_to_diffusers`, musubi's underscored form of the same names)."""

from mstar.adapters import LoraKeyRules

_ATTENTION = (("q", "to_q"), ("k", "to_k"), ("v", "to_v"), ("o", "to_out.0"))

WAN22_LORA_KEYS = LoraKeyRules(
    family="wan2.2",
    renames=(
        *((f"blocks.{{i}}.self_attn.{o}", f"blocks.{{i}}.attn1.{c}") for o, c in _ATTENTION),
        *((f"blocks.{{i}}.cross_attn.{o}", f"blocks.{{i}}.attn2.{c}") for o, c in _ATTENTION),
        ("blocks.{i}.cross_attn.k_img", "blocks.{i}.attn2.add_k_proj"),
        ("blocks.{i}.cross_attn.v_img", "blocks.{i}.attn2.add_v_proj"),
        ("blocks.{i}.ffn.0", "blocks.{i}.ffn.net.0.proj"),
        ("blocks.{i}.ffn.2", "blocks.{i}.ffn.net.2"),
        ("time_projection.1", "condition_embedder.time_proj"),
        ("head.head", "proj_out"),
        ("text_embedding.0", "condition_embedder.text_embedder.linear_1"),
        ("text_embedding.2", "condition_embedder.text_embedder.linear_2"),
        ("time_embedding.0", "condition_embedder.time_embedder.linear_1"),
        ("time_embedding.2", "condition_embedder.time_embedder.linear_2"),
    ),
    signature=r"^blocks[._]\d+[._](attn1|attn2|self_attn|cross_attn|ffn)[._]",
)
