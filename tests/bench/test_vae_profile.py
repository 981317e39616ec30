"""The VAE profile's kernel sorting (the profile itself needs CUDA: bench/h200.sh call21)."""

from mstar.bench.vae_profile import is_convolution_kernel


def test_convolutions_are_cudnn_kernels_not_triton_kernels_fused_after_them():
    cudnn = "sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x128x64_exec"
    assert is_convolution_kernel(cudnn)
    assert not is_convolution_kernel("triton_red_fused_convolution_native_group_norm_silu_50")
    assert not is_convolution_kernel("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNN")  # a plain GEMM
