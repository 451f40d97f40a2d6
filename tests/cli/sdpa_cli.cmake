# `qkv sdpa` end to end (included by CMakeLists.txt, whose qkv_cli_test it uses). Fixtures:
# tests/data/sdpa, made by make_sdpa_fixtures.py: q, k, v (and mask) of each case, its flags in
# args.txt, and float64 NumPy references following PyTorch's SDPA semantics.
set(sdpa_data ${CMAKE_CURRENT_SOURCE_DIR}/../data/sdpa)
cmake_path(NORMAL_PATH sdpa_data)

set(sdpa_backends cpu vulkan)

# qkv_cli_sdpa_parity(<case> [MAX_NMSE x]): the case on every backend, OUT (and W, where the case
# has expected weights) against the reference.
function(qkv_cli_sdpa_parity case)
  cmake_parse_arguments(ARG "" "MAX_NMSE" "" ${ARGN})
  set(dir ${sdpa_data}/${case})
  set(args sdpa --q ${dir}/q.npy --k ${dir}/k.npy --v ${dir}/v.npy --out out.npy)
  if(EXISTS ${dir}/mask.npy)
    list(APPEND args --mask ${dir}/mask.npy)
  endif()
  file(STRINGS ${dir}/args.txt flags)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  list(APPEND args ${flags})
  set(compare out.npy ${dir}/expected_out.npy)
  if(EXISTS ${dir}/expected_weights.npy)
    list(APPEND args --weights weights.npy)
    list(APPEND compare weights.npy ${dir}/expected_weights.npy)
  endif()
  set(extra "")
  if(ARG_MAX_NMSE)
    set(extra MAX_NMSE ${ARG_MAX_NMSE})
  endif()
  foreach(backend IN LISTS sdpa_backends)
    if(backend STREQUAL "cpu" OR NOT case STREQUAL "float64")
      qkv_cli_test(sdpa.parity.${case}.${backend} ARGS ${args} --backend ${backend} COMPARE ${compare} ${extra})
    endif()
  endforeach()
endfunction()

foreach(case IN ITEMS plain_2d gqa_4d_scale causal_top_left_3d causal_bottom_right_gqa causal_top_left_s1
                      causal_bottom_right_s1 bool_mask_key_padding bool_mask_empty_row additive_mask_causal decode_5000
                      single)
  qkv_cli_sdpa_parity(${case})
endforeach()
# float64 inputs beyond float32 (q by 1e100, k by 1e-100, a -1e300 mask) on the CPU backend: computed
# and written in float64 (a float32 result could not reach nmse 1e-24).
qkv_cli_sdpa_parity(float64 MAX_NMSE 1e-24)

# ---- help --------------------------------------------------------------------------------------------
qkv_cli_test(help.sdpa_listed ARGS --help STDOUT "sdpa +Scaled dot-product attention")
qkv_cli_test(help.sdpa_flags ARGS sdpa --help
             STDOUT "--q Q\\.npy" "--k K\\.npy" "--v V\\.npy" "--mask M\\.npy" "--causal-align" "top-left\\|bottom-right"
                    "--scale S" "--backend" "--precision" "--kernel" "--device" "--weights W\\.npy" "--out OUT\\.npy"
                    "enable_gqa=True")

# ---- bad input: exit 2, naming the inputs and their shapes; nothing written ------------------------
set(q3 ${sdpa_data}/causal_bottom_right_gqa/q.npy)  # (4, 37, 80)
set(k3 ${sdpa_data}/causal_bottom_right_gqa/k.npy)  # (2, 300, 80)
set(v3 ${sdpa_data}/causal_bottom_right_gqa/v.npy)  # (2, 300, 80)
set(q2 ${sdpa_data}/plain_2d/q.npy)                 # (3, 16)
set(k2 ${sdpa_data}/plain_2d/k.npy)                 # (300, 16)
set(v2 ${sdpa_data}/plain_2d/v.npy)                 # (300, 24)
qkv_cli_test(sdpa.bad.heads_do_not_divide ARGS sdpa --q ${q3} --k ${sdpa_data}/causal_top_left_3d/k.npy
             --v ${sdpa_data}/causal_top_left_3d/v.npy --backend cpu --out out.npy EXIT 2
             STDERR "q\\.npy \\(4, 37, 80\\) and .*k\\.npy \\(3, 300, 16\\): the K/V heads \\(3\\) must divide the query heads \\(4\\)")
qkv_cli_test(sdpa.bad.q_k_widths ARGS sdpa --q ${sdpa_data}/gqa_4d_scale/q.npy --k ${sdpa_data}/bool_mask_key_padding/k.npy
             --v ${sdpa_data}/bool_mask_key_padding/v.npy --backend cpu --out out.npy EXIT 2
             STDERR "q\\.npy \\(2, 4, 37, 64\\) and .*k\\.npy \\(2, 2, 300, 16\\): q and k must have the same width E \\(64 and 16\\)")
qkv_cli_test(sdpa.bad.k_v_lengths ARGS sdpa --q ${q2} --k ${k2} --v ${sdpa_data}/single/v.npy --backend cpu --out out.npy
             EXIT 2 STDERR "k\\.npy \\(300, 16\\) and .*v\\.npy \\(1, 16\\): k and v must have the same length S \\(300 and 1\\)")
qkv_cli_test(sdpa.bad.k_v_heads ARGS sdpa --q ${q3} --k ${k3} --v ${sdpa_data}/causal_top_left_3d/v.npy --backend cpu
             --out out.npy EXIT 2 STDERR "k\\.npy \\(2, 300, 80\\) and .*v\\.npy \\(3, 300, 16\\): k and v must have the same number of heads")
qkv_cli_test(sdpa.bad.ranks_differ ARGS sdpa --q ${q2} --k ${k3} --v ${v3} --backend cpu --out out.npy EXIT 2
             STDERR "q, k and v must have the same number of dimensions")
qkv_cli_test(sdpa.bad.mask_does_not_broadcast ARGS sdpa --q ${q2} --k ${k2} --v ${v2}
             --mask ${sdpa_data}/bool_mask_key_padding/mask.npy --backend cpu --out out.npy EXIT 2
             STDERR "mask\\.npy: mask shape \\(2, 1, 1, 300\\) does not broadcast to \\(batch, q_heads, q_len, kv_len\\) = \\(1, 1, 3, 300\\)"
                    "plain_2d/q\\.npy \\(3, 16\\), .*plain_2d/k\\.npy \\(300, 16\\)")
qkv_cli_test(sdpa.bad.mask_columns ARGS sdpa --q ${q2} --k ${k2} --v ${v2}
             --mask ${sdpa_data}/decode_5000/mask.npy --backend cpu --out out.npy EXIT 2
             STDERR "dimension 1 is 5000, expected 1 or kv_len = 300")
qkv_cli_test(sdpa.bad.bool_q ARGS sdpa --q ${sdpa_data}/bool_mask_empty_row/mask.npy --k ${k2} --v ${v2} --backend cpu
             --out out.npy EXIT 2 STDERR "mask\\.npy has dtype bool: q must be float32 or float64")
# Any finite float32 scale, negative and zero included, as PyTorch (the fixtures' args.txt hold it).
qkv_cli_sdpa_parity(scale_negative)
qkv_cli_sdpa_parity(scale_zero)
foreach(bad IN ITEMS nan inf -inf 1e39)
  qkv_cli_test(sdpa.bad.scale_${bad} ARGS sdpa --q ${q2} --k ${k2} --v ${v2} --scale ${bad} --backend cpu --out out.npy
               EXIT 2 STDERR "--scale ${bad}: ")
endforeach()
qkv_cli_test(sdpa.bad.scale_text ARGS sdpa --q ${q2} --k ${k2} --v ${v2} --scale abc --backend cpu --out out.npy EXIT 2
             STDERR "--scale abc: expected a number")
qkv_cli_test(sdpa.bad.align_without_causal ARGS sdpa --q ${q2} --k ${k2} --v ${v2} --causal-align bottom-right
             --backend cpu --out out.npy EXIT 2 STDERR "--causal-align needs --causal, --window or --alibi")
qkv_cli_test(sdpa.bad.align_name ARGS sdpa --q ${q2} --k ${k2} --v ${v2} --causal --causal-align middle --backend cpu
             --out out.npy EXIT 2 STDERR "--causal-align middle: expected one of top_left, bottom_right")
qkv_cli_test(sdpa.bad.missing_v ARGS sdpa --q ${q2} --k ${k2} --out out.npy EXIT 2 STDERR "--v is required")
qkv_cli_test(sdpa.bad.missing_file ARGS sdpa --q no-such.npy --k ${k2} --v ${v2} --backend cpu --out out.npy EXIT 2
             STDERR "no-such\\.npy: cannot open")
# ---- the Vulkan backend: both kernel families, fp16, and its own failures ------------------------
# qkv_cli_sdpa_vulkan(<case> <suffix> [flags...]): the case on Vulkan with extra flags; OUT (and W)
# against the reference, nmse 1e-9 (fp32) or 1e-5 (fp16).
function(qkv_cli_sdpa_vulkan case suffix)
  set(dir ${sdpa_data}/${case})
  set(args sdpa --q ${dir}/q.npy --k ${dir}/k.npy --v ${dir}/v.npy --backend vulkan --out out.npy ${ARGN})
  if(EXISTS ${dir}/mask.npy)
    list(APPEND args --mask ${dir}/mask.npy)
  endif()
  file(STRINGS ${dir}/args.txt flags)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  list(APPEND args ${flags})
  set(compare out.npy ${dir}/expected_out.npy)
  if(EXISTS ${dir}/expected_weights.npy)
    list(APPEND args --weights weights.npy)
    list(APPEND compare weights.npy ${dir}/expected_weights.npy)
  endif()
  set(nmse 1e-9)
  set(skip "")
  if("fp16" IN_LIST ARGN)
    set(nmse 1e-5)
  endif()
  if("coopmat" IN_LIST ARGN)  # where the device or the build lacks the family: skipped
    set(skip SKIP_IF_STDERR "does not offer VK_KHR_cooperative_matrix|no cooperative-matrix shaders|is refused on")
  endif()
  qkv_cli_test(sdpa.vulkan.${case}.${suffix} ARGS ${args} COMPARE ${compare} MAX_NMSE ${nmse} ${skip})
endfunction()
foreach(case IN ITEMS gqa_4d_scale causal_bottom_right_gqa bool_mask_key_padding additive_mask_causal decode_5000)
  qkv_cli_sdpa_vulkan(${case} kernel_cpu --kernel cpu)
  qkv_cli_sdpa_vulkan(${case} kernel_gpu --kernel gpu)
  qkv_cli_sdpa_vulkan(${case} fp16 --precision fp16)
  qkv_cli_sdpa_vulkan(${case} coopmat --kernel coopmat --precision fp16)
endforeach()
# The cooperative-matrix family refuses float32 (it multiplies float16): exit 1, naming why, on every
# device (one without the family says that instead).
qkv_cli_test(sdpa.vulkan.coopmat_fp32_refused
             ARGS sdpa --q ${sdpa_data}/plain_2d/q.npy --k ${sdpa_data}/plain_2d/k.npy --v ${sdpa_data}/plain_2d/v.npy
                  --kernel coopmat --out out.npy
             EXIT 1 STDERR "precision fp16|does not offer VK_KHR_cooperative_matrix|no cooperative-matrix shaders")
# float64 inputs beyond float32 cannot go to the device: refused, naming the file and element.
qkv_cli_test(sdpa.vulkan.float64_beyond_float32 ARGS sdpa --q ${sdpa_data}/float64/q.npy --k ${sdpa_data}/float64/k.npy
             --v ${sdpa_data}/float64/v.npy --backend vulkan --out out.npy EXIT 2
             STDERR "float64/q\\.npy: element 0 is .*beyond the float32 range")
qkv_cli_test(sdpa.vulkan.no_loader ARGS sdpa --q ${q2} --k ${k2} --v ${v2} --out out.npy EXIT 1 ENV ${no_loader}
             STDERR "no Vulkan loader" "run with --backend cpu")
qkv_cli_test(sdpa.vulkan.no_device ARGS sdpa --q ${q2} --k ${k2} --v ${v2} --device no-such-device --out out.npy
             EXIT 2 STDERR "--device no-such-device: no Vulkan device whose name contains")

# ---- output files: never over an input; an existing OUT survives a failed run ------------------------
qkv_cli_test(sdpa.files.out_is_input ARGS sdpa --q q.npy --k ${k2} --v ${v2} --backend cpu --out q.npy EXIT 2
             COPY ${q2} q.npy STDERR "--out q\\.npy is the input --q q\\.npy")
qkv_cli_test(sdpa.files.weights_is_mask ARGS sdpa --q ${q2} --k ${k2} --v ${v2} --mask m.npy --backend cpu
             --out out.npy --weights m.npy EXIT 2 COPY ${sdpa_data}/bool_mask_empty_row/mask.npy m.npy
             STDERR "--weights m\\.npy is the input --mask m\\.npy")
qkv_cli_test(sdpa.files.weights_fail_keeps_out ARGS sdpa --q ${q2} --k ${k2} --v ${v2} --backend cpu --out out.npy
             --weights missing/w.npy EXIT 1 COPY ${sdpa_data}/plain_2d/expected_out.npy out.npy
             STDERR "missing/w\\.npy: cannot create a file in its directory")
qkv_cli_test(sdpa.files.bad_input_keeps_out ARGS sdpa --q ${q2} --k ${k2} --v ${sdpa_data}/single/v.npy --backend cpu
             --out out.npy EXIT 2 COPY ${sdpa_data}/plain_2d/expected_out.npy out.npy STDERR "same length S")

# ---- ragged batches (--cu-seqlens-q/--cu-seqlens-k): FlashAttention's varlen layout ------------------
# Lengths 0, 1, 3, 17 and 113 in one batch, GQA, causal bottom-right per sequence, softcap, a window:
# OUT and LSE against make_varlen_fixtures.py's reference, on both backends.
set(varlen ${sdpa_data}/varlen)
file(STRINGS ${varlen}/args.txt varlen_flags)
separate_arguments(varlen_flags UNIX_COMMAND "${varlen_flags}")
set(varlen_args sdpa --q ${varlen}/q.npy --k ${varlen}/k.npy --v ${varlen}/v.npy --out out.npy)
foreach(backend IN LISTS sdpa_backends)
  qkv_cli_test(sdpa.varlen.${backend} ARGS ${varlen_args} ${varlen_flags} --lse lse.npy --backend ${backend}
               COMPARE out.npy ${varlen}/expected_out.npy lse.npy ${varlen}/expected_lse.npy)
endforeach()
# Refused before any file is written: offsets that decrease, one list alone, a mask, the weights.
qkv_cli_test(sdpa.varlen.decreasing ARGS ${varlen_args} --cu-seqlens-q 0,4,1,21,21,134,143
             --cu-seqlens-k 0,1,18,23,27,140,143 --backend cpu EXIT 2 STDERR "cu_seqlens_q must be nondecreasing")
qkv_cli_test(sdpa.varlen.k_alone ARGS ${varlen_args} --cu-seqlens-k 0,143 --backend cpu EXIT 2
             STDERR "--cu-seqlens-q and --cu-seqlens-k go together")
# The offsets as int32 .npy files (FlashAttention's cu_seqlens saved with np.save): the same results;
# a file of another dtype, a list entry that is not a number, offsets that miss k's rows, and an
# output over an offsets file are refused (exit 2) with nothing written.
set(varlen_rules --causal --causal-align bottom-right --softcap 3 --window 7,0)
qkv_cli_test(sdpa.varlen.offset_files ARGS ${varlen_args} ${varlen_rules} --cu-seqlens-q ${varlen}/cu_seqlens_q.npy
             --cu-seqlens-k ${varlen}/cu_seqlens_k.npy --lse lse.npy --backend cpu
             COMPARE out.npy ${varlen}/expected_out.npy lse.npy ${varlen}/expected_lse.npy)
qkv_cli_test(sdpa.varlen.offsets_float ARGS ${varlen_args} --cu-seqlens-q ${varlen}/expected_lse.npy
             --cu-seqlens-k ${varlen}/cu_seqlens_k.npy --backend cpu EXIT 2
             STDERR "--cu-seqlens-q .*expected_lse\\.npy is float64 \\(4, 143\\): the offsets are int32 \\(B \\+ 1,\\)")
qkv_cli_test(sdpa.varlen.offsets_not_numbers ARGS ${varlen_args} --cu-seqlens-q 0,1,x,143
             --cu-seqlens-k ${varlen}/cu_seqlens_k.npy --backend cpu EXIT 2 STDERR "\"x\" is not an integer")
qkv_cli_test(sdpa.varlen.offsets_miss_rows ARGS ${varlen_args} --cu-seqlens-q ${varlen}/cu_seqlens_q.npy
             --cu-seqlens-k 0,1,18,23,27,140,142 --backend cpu EXIT 2 STDERR "total_k = cu_seqlens_k\\[B\\]")
qkv_cli_test(sdpa.varlen.out_is_offsets ARGS sdpa --q ${varlen}/q.npy --k ${varlen}/k.npy --v ${varlen}/v.npy
             --out cu.npy --cu-seqlens-q cu.npy --cu-seqlens-k ${varlen}/cu_seqlens_k.npy --backend cpu EXIT 2
             COPY ${varlen}/cu_seqlens_q.npy cu.npy UNCHANGED cu.npy STDERR "--out cu\\.npy is the input --cu-seqlens-q")
qkv_cli_test(sdpa.varlen.weights ARGS ${varlen_args} ${varlen_flags} --weights w.npy EXIT 2
             STDERR "context::sdpa over a ragged batch: return_weights is not available")
