# nxd-plan --inference (tools/nxd_plan_inference.cpp): the modeled TTFT, TPOT and output tokens/s
# of a preset at a TP degree without a checkpoint, heads, FFN and vocabulary padded to the TP
# degree; its refusals (exit 2 naming the value) and its determinism.
if(TARGET nxd-plan)
  set(_inf $<TARGET_FILE:nxd-plan> --inference)
  set(_s70 --model llama2-70b --instance inf2.48xlarge
           --set distributed_strategy.tensor_model_parallel_size=24)
  # Llama-2-70B at TP 24: 64 heads do not divide 24; padded to 72 (KV 8 replicated x3), FFN and
  # vocabulary to multiples of 24; TPOT is the fitted row's (published 32.90 ms)
  add_test(NAME NxdPlan.InferencePadsLlama2_70BForTp24
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=llama2-70b on inf2.48xlarge at TP 24, batch 1, 128 prompt \\+ 128 new tokens, bf16\npadded for TP 24 as the Neuron libraries pad: attention heads 64 -> 72, KV heads 8 replicated x3 \\(24\\), FFN 28672 -> 28680, vocabulary 32000 -> 32016\n.*predicted inference: TTFT [0-9.]+ ms, TPOT 32\\.(8[5-9]|9[0-5]) ms, [0-9.]+ output tokens/s"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake ${_inf} ${_s70})
  # Mistral-7B (GQA 32/8) at TP 24 with batch 8: query heads 32 -> 48, KV 8 replicated x3
  add_test(NAME NxdPlan.InferenceBatchAndGqaPadding
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=mistral-7b on inf2.48xlarge at TP 24, batch 8, 128 prompt \\+ 3968 new tokens.*attention heads 32 -> 48, KV heads 8 replicated x3 \\(24\\), FFN 14336 -> 14352, vocabulary 32000 -> 32016.*predicted inference: TTFT [0-9.]+ ms, TPOT [0-9.]+ ms, [0-9.]+ output tokens/s"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake ${_inf} --model mistral-7b
            --instance inf2.48xlarge --set distributed_strategy.tensor_model_parallel_size=24
            --batch 8 --prompt-tokens 128 --new-tokens 3968)
  add_test(NAME NxdPlan.InferenceNothingToPad
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=attention heads 40, KV heads 40, FFN 13824, vocabulary 32016 \\(nothing padded\\)"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake ${_inf} --model codellama-13b
            --instance trn1.32xlarge --set distributed_strategy.tensor_model_parallel_size=8)
  # GPT-3 175B at TP 12: 29 GiB of weights per core, estimated all the same, exit 3
  add_test(NAME NxdPlan.InferenceModelOverHbmExitsThree
    COMMAND ${CMAKE_COMMAND} -DCODE=3
            "-DREGEX=per NeuronCore: weights [0-9.]+ GiB \\+ KV cache [0-9.]+ GiB of 16.00 GiB HBM \\(does not fit\\).*predicted inference: TTFT"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake ${_inf} --model gpt3-175b
            --instance inf2.48xlarge --set distributed_strategy.tensor_model_parallel_size=12)
  add_test(NAME NxdPlan.InferenceRefusesTpPastTheInstance
    COMMAND ${CMAKE_COMMAND} -DCODE=2
            "-DREGEX=tensor_model_parallel_size=25 must be in \\[1, 24\\] \\(the NeuronCores of inf2.48xlarge\\)"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake ${_inf} --model llama2-7b
            --instance inf2.48xlarge --set distributed_strategy.tensor_model_parallel_size=25)
  add_test(NAME NxdPlan.InferenceRefusesBatchZero
    COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=--batch.*0"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake ${_inf} ${_s70} --batch 0)
  add_test(NAME NxdPlan.InferenceSizesNeedInference
    COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=--prompt-tokens.*go with --inference"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan>
            --prompt-tokens 64)
  # a 10,000-token prompt served with a max context of 12,288 runs in the 12,288 bucket
  add_test(NAME NxdPlan.InferencePromptRunsInItsContextBucket
    COMMAND ${CMAKE_COMMAND} -DCODE=0 "-DREGEX=prefill: the prompt in its context bucket of 12288 tokens"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake ${_inf} --model llama2-7b
            --instance trn1.32xlarge --set distributed_strategy.tensor_model_parallel_size=32
            --prompt-tokens 10000 --new-tokens 16 --max-context-tokens 12288)
  add_test(NAME NxdPlan.InferenceRefusesMaxContextBelowThePrompt
    COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=--max-context-tokens 100 is below --prompt-tokens 128"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake ${_inf} --model llama2-7b
            --max-context-tokens 100)
  add_test(NAME NxdPlan.InferenceRefusesAnUnknownPrefillAttention
    COMMAND ${CMAKE_COMMAND} -DCODE=2
            "-DREGEX=--prefill-attention 'fused': expected materialized or flash"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake ${_inf} --model llama2-7b
            --prefill-attention fused)
  add_test(NAME NxdPlan.InferenceRefusesSearch
    COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=--inference and --search do not go together"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake ${_inf} ${_s70} --search)
  add_test(NAME NxdPlan.InferenceRefusesAnUnknownInstance
    COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=inf3.large"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake ${_inf} --model llama2-7b
            --instance inf3.large)
  add_test(NAME NxdPlan.InferenceIsDeterministic
    COMMAND ${CMAKE_COMMAND} "-DREGEX=predicted inference: TTFT" "-DIGNORE=^$"
            -P ${CMAKE_SOURCE_DIR}/tests/support/same_output_twice.cmake ${_inf} ${_s70}
            --batch 4 --prompt-tokens 1024 --new-tokens 1024)
  # every published row of docs/VALIDATION.md through nxd-plan (bench/inference_validation.py):
  # the counts within +-15% must not fall below what the model reaches (TTFT 23, TPOT 59 of 66)
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    add_test(NAME NxdPlan.InferencePublishedRowsWithinFifteenPercentDoNotRegress
      COMMAND ${CMAKE_COMMAND} -DCODE=0
              "-DREGEX=within \\+-15%: TTFT (2[3-9]|[3-6][0-9]) of 66, TPOT (59|6[0-6]) of 66"
              -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake ${Python3_EXECUTABLE}
              ${CMAKE_SOURCE_DIR}/bench/inference_validation.py $<TARGET_FILE:nxd-plan>)
    set_tests_properties(NxdPlan.InferencePublishedRowsWithinFifteenPercentDoNotRegress
      PROPERTIES LABELS tools TIMEOUT 300)
  endif()
  set_tests_properties(NxdPlan.InferencePadsLlama2_70BForTp24 NxdPlan.InferenceBatchAndGqaPadding
    NxdPlan.InferenceNothingToPad NxdPlan.InferenceModelOverHbmExitsThree
    NxdPlan.InferenceRefusesTpPastTheInstance
    NxdPlan.InferenceRefusesBatchZero NxdPlan.InferenceSizesNeedInference
    NxdPlan.InferenceRefusesSearch NxdPlan.InferenceRefusesAnUnknownInstance
    NxdPlan.InferencePromptRunsInItsContextBucket NxdPlan.InferenceRefusesMaxContextBelowThePrompt
    NxdPlan.InferenceRefusesAnUnknownPrefillAttention
    NxdPlan.InferenceIsDeterministic PROPERTIES LABELS tools TIMEOUT 60)
endif()
