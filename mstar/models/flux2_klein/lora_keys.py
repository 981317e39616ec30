"""FLUX.2's LoRA key layouts (torch-free): the original (BFL / ai-toolkit) module names as
`_convert_non_diffusers_flux2_lora_to_diffusers` renames them, with each double block's fused qkv
LoRA split into the three projections (A shared, B in thirds); kohya's are the same names with
underscores."""

from mstar.adapters import LoraKeyRules

_DOUBLE = (
    ("img_attn.proj", "attn.to_out.0"),
    ("txt_attn.proj", "attn.to_add_out"),
    ("img_mlp.0", "ff.linear_in"),
    ("img_mlp.2", "ff.linear_out"),
    ("txt_mlp.0", "ff_context.linear_in"),
    ("txt_mlp.2", "ff_context.linear_out"),
)
_GLOBAL = (
    ("img_in", "x_embedder"),
    ("txt_in", "context_embedder"),
    ("time_in.in_layer", "time_guidance_embed.timestep_embedder.linear_1"),
    ("time_in.out_layer", "time_guidance_embed.timestep_embedder.linear_2"),
    ("guidance_in.in_layer", "time_guidance_embed.guidance_embedder.linear_1"),
    ("guidance_in.out_layer", "time_guidance_embed.guidance_embedder.linear_2"),
    ("final_layer.linear", "proj_out"),
    ("final_layer.adaLN_modulation.1", "norm_out.linear"),
    ("single_stream_modulation.lin", "single_stream_modulation.linear"),
    ("double_stream_modulation_img.lin", "double_stream_modulation_img.linear"),
    ("double_stream_modulation_txt.lin", "double_stream_modulation_txt.linear"),
)

FLUX2_LORA_KEYS = LoraKeyRules(
    family="flux.2",
    renames=(
        ("single_blocks.{i}.linear1", "single_transformer_blocks.{i}.attn.to_qkv_mlp_proj"),
        ("single_blocks.{i}.linear2", "single_transformer_blocks.{i}.attn.to_out"),
        *((f"double_blocks.{{i}}.{o}", f"transformer_blocks.{{i}}.{d}") for o, d in _DOUBLE),
        *_GLOBAL,
    ),
    splits=(
        (
            "double_blocks.{i}.img_attn.qkv",
            tuple(f"transformer_blocks.{{i}}.attn.to_{p}" for p in "qkv"),
        ),
        (
            "double_blocks.{i}.txt_attn.qkv",
            tuple(f"transformer_blocks.{{i}}.attn.add_{p}_proj" for p in "qkv"),
        ),
    ),
    signature=r"^(double_blocks|single_blocks|single_transformer_blocks|transformer_blocks[._]\d+[._](attn[._]add_|attn[._]to_add_out|ff_context))",
)
