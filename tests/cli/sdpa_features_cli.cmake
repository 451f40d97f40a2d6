# `qkv sdpa` beyond PyTorch's SDPA (--window, --sinks, --softcap, --alibi, --kv-type, --lse) and
# `qkv merge`, end to end (included by CMakeLists.txt, whose qkv_cli_test it uses). Fixtures:
# tests/data/sdpa/features (make_feature_fixtures.py: the inputs, each case's flags in args.txt,
# float64 NumPy references of qkv/runtime/sdpa.hpp's semantics) and tests/data/sdpa/merge
# (make_merge_fixtures.py: partial results and the whole call).
set(features_data ${CMAKE_CURRENT_SOURCE_DIR}/../data/sdpa/features)
cmake_path(NORMAL_PATH features_data)
set(merge_data ${CMAKE_CURRENT_SOURCE_DIR}/../data/sdpa/merge)
cmake_path(NORMAL_PATH merge_data)

# qkv_cli_sdpa_feature(<case> <suffix> [MAX_NMSE x] [flags...]): the case with its flags and extra
# ones; OUT, LSE (and W, where the case has expected weights) against the reference.
function(qkv_cli_sdpa_feature case suffix)
  cmake_parse_arguments(ARG "" "MAX_NMSE" "" ${ARGN})
  set(dir ${features_data}/${case})
  set(args sdpa --q ${dir}/q.npy --k ${dir}/k.npy --v ${dir}/v.npy --out out.npy --lse lse.npy ${ARG_UNPARSED_ARGUMENTS})
  foreach(input IN ITEMS mask sinks)
    if(EXISTS ${dir}/${input}.npy)
      list(APPEND args --${input} ${dir}/${input}.npy)
    endif()
  endforeach()
  file(STRINGS ${dir}/args.txt flags)
  separate_arguments(flags UNIX_COMMAND "${flags}")
  list(APPEND args ${flags})
  set(compare out.npy ${dir}/expected_out.npy lse.npy ${dir}/expected_lse.npy)
  if(EXISTS ${dir}/expected_weights.npy)
    list(APPEND args --weights weights.npy)
    list(APPEND compare weights.npy ${dir}/expected_weights.npy)
  endif()
  set(nmse 1e-9)
  if(ARG_MAX_NMSE)
    set(nmse ${ARG_MAX_NMSE})
  endif()
  qkv_cli_test(sdpa.features.${case}.${suffix} ARGS ${args} COMPARE ${compare} MAX_NMSE ${nmse})
endfunction()

file(GLOB feature_cases RELATIVE ${features_data} ${features_data}/*/args.txt)
list(TRANSFORM feature_cases REPLACE "/args.txt$" "")
list(SORT feature_cases)
foreach(case IN LISTS feature_cases)
  qkv_cli_sdpa_feature(${case} cpu --backend cpu)
  qkv_cli_sdpa_feature(${case} kernel_cpu --backend vulkan --kernel cpu)
  qkv_cli_sdpa_feature(${case} kernel_gpu --backend vulkan --kernel gpu)
endforeach()
# fp16 queries (the reference keeps them unrounded: nmse 1e-5, as the other fp16 CLI tests)
foreach(case IN ITEMS everything sinks_masked alibi_gqa_20 window_causal_bottom_right_l_gt_s)
  qkv_cli_sdpa_feature(${case} fp16 --backend vulkan --precision fp16 MAX_NMSE 1e-5)
endforeach()
# float64 inputs on the cpu backend: everything, the lse too, written as float64
qkv_cli_test(sdpa.features.float64_lse ARGS sdpa --q ${sdpa_data}/float64/q.npy --k ${sdpa_data}/float64/k.npy
             --v ${sdpa_data}/float64/v.npy --backend cpu --out out.npy --lse lse.npy --window 3,-1
             PRESENT out.npy lse.npy)

# ---- merge ---------------------------------------------------------------------------------------
set(m2 ${merge_data}/halves_sinks)
set(m3 ${merge_data}/interleaved_three)
qkv_cli_test(merge.parity.halves_sinks ARGS merge --part ${m2}/o1.npy ${m2}/lse1.npy --part ${m2}/o2.npy ${m2}/lse2.npy
             --sinks ${m2}/sinks.npy --out out.npy --lse lse.npy
             COMPARE out.npy ${m2}/expected_out.npy lse.npy ${m2}/expected_lse.npy MAX_NMSE 1e-12)
qkv_cli_test(merge.parity.interleaved_three ARGS merge --part ${m3}/o1.npy ${m3}/lse1.npy --part ${m3}/o2.npy
             ${m3}/lse2.npy --part ${m3}/o3.npy ${m3}/lse3.npy --out out.npy --lse lse.npy
             COMPARE out.npy ${m3}/expected_out.npy lse.npy ${m3}/expected_lse.npy MAX_NMSE 1e-12)
qkv_cli_test(merge.bad.shapes_differ ARGS merge --part ${m2}/o1.npy ${m2}/lse1.npy --part ${m3}/o1.npy ${m3}/lse1.npy
             --out out.npy EXIT 2 STDERR "every part's output must have the same shape")
qkv_cli_test(merge.bad.lse_shape ARGS merge --part ${m2}/o1.npy ${m2}/o1.npy --out out.npy EXIT 2
             STDERR "the log-sum-exp must have .*o1\\.npy's leading dimensions \\(2, 4, 5\\)")
qkv_cli_test(merge.bad.sinks_shape ARGS merge --part ${m2}/o1.npy ${m2}/lse1.npy --sinks ${m2}/lse1.npy --out out.npy
             EXIT 2 STDERR "--sinks .*lse1\\.npy \\(2, 4, 5\\): the sinks must be one logit per query head, \\(Hq,\\) = \\(4,\\)")
qkv_cli_test(merge.bad.empty_out ARGS merge --part ${m2}/o1.npy ${m2}/lse1.npy --out <EMPTY> EXIT 2 STDERR "--out is empty")
qkv_cli_test(merge.bad.empty_lse ARGS merge --part ${m2}/o1.npy ${m2}/lse1.npy --out out.npy --lse <EMPTY> EXIT 2
             STDERR "--lse is empty")
qkv_cli_test(merge.bad.one_file ARGS merge --part ${m2}/o1.npy --out out.npy EXIT 2
             STDERR "--part takes two files|--part: 1 required")
qkv_cli_test(merge.files.out_is_part ARGS merge --part o1.npy ${m2}/lse1.npy --out o1.npy EXIT 2 COPY ${m2}/o1.npy o1.npy
             STDERR "--out o1\\.npy is the input --part o1\\.npy")
qkv_cli_test(help.merge_listed ARGS --help STDOUT "merge +Merge partial attention results")

# ---- bad values: exit 2, naming the flag; nothing written ------------------------------------------
set(fd ${features_data}/window_top_left)  # q (4, 17, 32), k, v (2, 113, 32)
set(f_args sdpa --q ${fd}/q.npy --k ${fd}/k.npy --v ${fd}/v.npy --out out.npy)
foreach(backend IN ITEMS cpu vulkan)
  qkv_cli_test(sdpa.features.bad.window_below_minus_one.${backend} ARGS ${f_args} --window -2,0 --backend ${backend}
               EXIT 2 STDERR "--window -2,0: each side must be -1 \\(unbounded\\) or at least 0")
endforeach()
qkv_cli_test(sdpa.features.bad.window_one_side ARGS ${f_args} --window 3 --backend cpu EXIT 2
             STDERR "--window 3: expected LEFT,RIGHT")
qkv_cli_test(sdpa.features.bad.window_text ARGS ${f_args} --window a,b --backend cpu EXIT 2
             STDERR "--window a,b: expected LEFT,RIGHT")
foreach(bad IN ITEMS 0 -1 nan inf)
  qkv_cli_test(sdpa.features.bad.softcap_${bad} ARGS ${f_args} --softcap ${bad} --backend cpu EXIT 2
               STDERR "--softcap ${bad}: ")
endforeach()
qkv_cli_test(sdpa.features.bad.alibi_zero ARGS ${f_args} --alibi 0 --backend cpu EXIT 2 STDERR "--alibi 0: must be above 0")
qkv_cli_test(sdpa.features.bad.sinks_shape ARGS ${f_args} --sinks ${features_data}/single_lse/sinks.npy --backend cpu
             EXIT 2 STDERR "--sinks .*sinks\\.npy \\(1,\\): the sinks must be one logit per query head, \\(Hq,\\) = \\(4,\\)")
qkv_cli_test(sdpa.features.bad.sinks_2d ARGS ${f_args} --sinks ${fd}/q.npy --backend cpu EXIT 2
             STDERR "--sinks .*q\\.npy \\(4, 17, 32\\): the sinks must be one logit per query head, \\(Hq,\\) = \\(4,\\)")
qkv_cli_test(sdpa.features.bad.sinks_empty ARGS ${f_args} --sinks <EMPTY> --backend cpu EXIT 2 STDERR "--sinks is empty")
qkv_cli_test(sdpa.features.bad.lse_empty ARGS ${f_args} --lse <EMPTY> --backend cpu EXIT 2 STDERR "--lse is empty")
qkv_cli_test(sdpa.features.bad.kv_type_name ARGS ${f_args} --kv-type q5_1 --backend cpu EXIT 2
             STDERR "--kv-type q5_1: expected one of f32, f16, q8_0, q4_0")
# A NaN in K that q8_0 cannot store: the file named, and the element's index in it.
set(q8 ${features_data}/kv_q8_0)
foreach(backend IN ITEMS cpu vulkan)
  qkv_cli_test(sdpa.features.bad.q8_0_nan_k.${backend} ARGS sdpa --q ${q8}/q.npy --k ${q8}/k_nan.npy --v ${q8}/v.npy
               --kv-type q8_0 --backend ${backend} --out out.npy EXIT 2
               STDERR "--k .*k_nan\\.npy stored as --kv-type q8_0: quantize to q8_0: element 9797 is nan")
endforeach()
set(odd ${sdpa_data}/plain_2d)  # E = 16, Ev = 24
foreach(t IN ITEMS q8_0 q4_0)
  foreach(backend IN ITEMS cpu vulkan)
    qkv_cli_test(sdpa.features.bad.${t}_width.${backend} ARGS sdpa --q ${odd}/q.npy --k ${odd}/k.npy --v ${odd}/v.npy
                 --kv-type ${t} --backend ${backend} --out out.npy EXIT 2
                 STDERR "--kv-type ${t}: stores blocks of 32 values along each row of K and V, so E \\(16\\) and Ev \\(24\\) must be multiples of 32")
  endforeach()
endforeach()
qkv_cli_test(sdpa.features.files.lse_is_input ARGS sdpa --q ${fd}/q.npy --k ${fd}/k.npy --v v.npy --out out.npy
             --lse v.npy --backend cpu EXIT 2 COPY ${fd}/v.npy v.npy STDERR "--lse v\\.npy is the input --v v\\.npy")
qkv_cli_test(sdpa.features.files.out_is_sinks ARGS sdpa --q ${fd}/q.npy --k ${fd}/k.npy --v ${fd}/v.npy --out s.npy
             --sinks s.npy --backend cpu EXIT 2 COPY ${features_data}/sinks_masked/sinks.npy s.npy
             STDERR "--out s\\.npy is the input --sinks s\\.npy")
qkv_cli_test(help.sdpa_feature_flags ARGS sdpa --help
             STDOUT "--window LEFT,RIGHT" "--sinks SINKS\\.npy" "--softcap C" "--alibi MAX_BIAS"
                    "--kv-type f32\\|f16\\|q8_0\\|q4_0" "--lse LSE\\.npy")
