# nxd-train refuses a model that cannot fit before allocating anything (train_app/plan.h), exit 2
# with the rank, the breakdown, the capacity and what to change: issue 24's two commands (one fp32
# rank of 4.8B parameters; the default 8-rank layout at hidden 16384 x 16 layers), each of which
# grew to 19-22 GB of host memory before the kernel killed it; and a run over the host RAM its sim
# ranks share (NXD_HOST_RAM_BYTES makes the machine small).
if(TARGET nxd-train)
  set(_plan_out ${CMAKE_CURRENT_BINARY_DIR}/plan_refusals)
  add_test(NAME NxdTrain.RefusesAOneRankModelOverHbm
    COMMAND ${CMAKE_COMMAND} -DCODE=2
            "-DREGEX=rank 0 \\(stage 0\\) needs parameters 18.11 GiB, gradients 18.11 GiB, optimizer state 36.22 GiB.* over the 16.00 GiB HBM of a trn1.32xlarge NeuronCore. To fit: "
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-train>
            --set model.hidden_size=8192 --set model.num_attention_heads=64
            --set model.num_layers=6 --set backend.world_size=1
            --set distributed_strategy.tensor_model_parallel_size=1 --set precision.type=fp32
            --out ${_plan_out}/one)
  add_test(NAME NxdTrain.RefusesAnEightRankModelOverHbm
    COMMAND ${CMAKE_COMMAND} -DCODE=2
            "-DREGEX=the model does not fit: rank [0-9]+ \\(stage 0\\) needs parameters 96.14 GiB.*HBM.*distributed_strategy.zero1=true"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-train>
            --set model.hidden_size=16384 --set model.num_attention_heads=64
            --set model.num_layers=16 --out ${_plan_out}/eight)
  add_test(NAME NxdTrain.RefusesARunOverTheSharedHostRam
    COMMAND ${CMAKE_COMMAND} -DCODE=2
            "-DREGEX=does not fit in host memory: its 8 sim rank\\(s\\) need .* over the 1.0 MiB of RAM they share"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake
            ${CMAKE_COMMAND} -E env NXD_HOST_RAM_BYTES=1048576 $<TARGET_FILE:nxd-train>
            --set trainer.max_steps=1 --out ${_plan_out}/host)
  # a mixture-of-experts model whose experts do not fit (8 f32 experts of 3 x 2048 x 49152):
  # the refusal suggests expert parallelism
  add_test(NAME NxdTrain.RefusalSuggestsExpertParallelism
    COMMAND ${CMAKE_COMMAND} -DCODE=2
            "-DREGEX=the model does not fit: rank 0 .* To fit: .*split the experts over more ranks \\(distributed_strategy.expert_model_parallel_size, now 1: each rank holds 8 / EP experts; EP divides the data-parallel size 4\\)"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-train>
            --set model.arch=mixtral --set model.moe.num_experts=8 --set model.hidden_size=2048
            --set model.num_attention_heads=2 --set model.num_kv_heads=2
            --set model.ffn_hidden_size=98304 --set model.num_layers=1 --set backend.world_size=4
            --set distributed_strategy.tensor_model_parallel_size=1 --set precision.type=fp32
            --set distributed_strategy.sequence_parallel=false --out ${_plan_out}/experts)
  set_tests_properties(NxdTrain.RefusesAOneRankModelOverHbm NxdTrain.RefusesAnEightRankModelOverHbm
    NxdTrain.RefusesARunOverTheSharedHostRam NxdTrain.RefusalSuggestsExpertParallelism
    PROPERTIES LABELS tools TIMEOUT 60)
endif()
# nxd-plan: a 256-rank plan (8 trn1.32xlarge nodes; about 4 s), and --search finding layouts that
# fit a model whose configured layout (one rank per replica, micro batch 8 of 8192 tokens) does
# not (exit 3 for a plan that does not fit).
if(TARGET nxd-plan)
  add_test(NAME NxdPlan.PlansTwoHundredFiftySixRanks
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=on 8xtrn1.32xlarge \\(256 NeuronCores\\): TP 8 x PP 4 x DP 8.*memory plan: stage 3 .*step \\(modeled, rank [0-9]+, stage [0-9]\\): [0-9.]+ s = compute [0-9.]+ s \\+ exposed communication [0-9.]+ s \\+ pipeline bubble [0-9.]+ s.*predicted: [0-9.]+ seq/s, [0-9]+ tokens/s, MFU [0-9.]+, step [0-9.]+ s, memory [0-9.]+ GiB of 16.00 GiB per core \\(fits\\).*planner: [0-9.]+ s, peak RSS [0-9.]+ MiB"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan>
            --nodes 8 --set model.hidden_size=256 --set model.num_attention_heads=8
            --set model.num_layers=8 --set distributed_strategy.tensor_model_parallel_size=8
            --set distributed_strategy.pipeline_model_parallel_size=4 --set data.seq_length=256
            --set data.global_batch_size=64 --set data.micro_batch_size=1)
  set(_big --nodes 1 --set model.hidden_size=2048 --set model.num_attention_heads=16
           --set model.num_layers=2 --set data.seq_length=8192
           --set model.max_position_embeddings=8192 --set data.global_batch_size=256
           --set data.micro_batch_size=8 --set precision.type=fp32
           --set distributed_strategy.tensor_model_parallel_size=1)
  add_test(NAME NxdPlan.ConfiguredLayoutDoesNotFit
    COMMAND ${CMAKE_COMMAND} -DCODE=3
            "-DREGEX=memory [0-9.]+ GiB of 16.00 GiB per core \\(does not fit\\)"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan> ${_big})
  add_test(NAME NxdPlan.SearchFindsLayoutsThatFit
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=[0-9]+ fit; the fastest:\n 1\\. TP [0-9]+ x PP [0-9]+ x DP [0-9]+, micro batch [0-9]+[^\n]*memory [0-9.]+ GiB; why: [^\n]+\n 2\\. [^\n]+\n.*1 over 2: step [0-9.]+ s against [0-9.]+ s: compute"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan> ${_big}
            --search)
  # issue 34, case 6: a million layers ended in bad_alloc (7.6 GiB at 120 s); the closed-form
  # bound on the parameters says "does not fit" with the numbers before planning (exit 3)
  add_test(NAME NxdPlan.AMillionLayersDoNotFitBeforePlanning
    COMMAND ${CMAKE_COMMAND} -DCODE=3
            "-DREGEX=the model does not fit: its parameters alone \\(at least [0-9.e+]+ of them, [0-9.]+ GiB\\) need at least [0-9.]+ GiB per NeuronCore split over TP x PP = [0-9]+ ranks, over the 16.00 GiB HBM of a [0-9x]*trn1.32xlarge NeuronCore \\(found before planning: model.num_layers=1000000"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan>
            --set model.num_layers=1000000)
  set_tests_properties(NxdPlan.AMillionLayersDoNotFitBeforePlanning PROPERTIES LABELS tools
                       TIMEOUT 60)
  # issue 34, case 7: --search of llama2-70b on one node printed nothing for 120 s. Its work is
  # bounded by memory first (layouts over HBM by the closed-form bound unplanned, the least-memory
  # choice of a layout first): at most 9 plans, each printed (to stderr, after stdout here) as it
  # finishes, and none fits
  add_test(NAME NxdPlan.SearchIsBoundedByMemoryFirst
    COMMAND ${CMAKE_COMMAND} -DCODE=3
            "-DREGEX=layouts of llama2-70b on trn1.32xlarge \\([1-9] choices of ZeRO-1 and checkpointing planned, [0-9]+ skipped by memory unplanned\\), 0 fit.*none fits: the least any layout needs is [0-9.]+ GiB.*nxd-plan --search: \\[1/200\\] TP [0-9]+ x PP [0-9]+ x CP 1, EP 1, micro batch [0-9]+, [^\n]*: needs [0-9.]+ GiB \\(does not fit\\)"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan>
            --model llama2-70b --nodes 1 --search)
  set_tests_properties(NxdPlan.SearchIsBoundedByMemoryFirst PROPERTIES LABELS tools TIMEOUT 120)
  add_test(NAME NxdPlan.UnknownModelIsAUserMistake
    COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX=unknown --model 'llama9'"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan>
            --model llama9)
  # --nodes is a whole decimal integer (issue 34: atoi planned 1 node for 1e6 and 16 for 16abc)
  foreach(_bad 1e6 16abc 0 100000)
    add_test(NAME NxdPlan.MalformedNodes_${_bad}
      COMMAND ${CMAKE_COMMAND} -DCODE=2
              "-DREGEX=--nodes must be an integer in \\[1, 1024\\], got '${_bad}'"
              -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan>
              --model llama2-7b --nodes ${_bad})
    set_tests_properties(NxdPlan.MalformedNodes_${_bad} PROPERTIES LABELS tools TIMEOUT 60)
  endforeach()
  # the gpt3-175b preset (GPT-3's widths, 2 of its 96 layers) plans at TP 32 with its vocabulary
  # padded to a multiple of the TP size
  add_test(NAME NxdPlan.Gpt3PresetPlans
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=gpt3-175b on trn1.32xlarge \\(32 NeuronCores\\): TP 32 x PP 1 x DP 1.*predicted: [0-9.]+ seq/s.*\\(fits\\)"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan>
            --model gpt3-175b --set model.num_layers=2
            --set distributed_strategy.tensor_model_parallel_size=32
            --set distributed_strategy.sequence_parallel=true --set data.seq_length=2048
            --set data.global_batch_size=2 --set data.micro_batch_size=1
            --set precision.type=mixed_precision)
  # --search with context parallelism: one layer of hidden 1024 over sequences of 1,048,576
  # tokens does not fit a NeuronCore at CP 1 under any TP (4 heads: TP <= 4) or micro batch, so
  # every layout that fits splits the sequence, and says so (about 1 s)
  add_test(NAME NxdPlan.SearchSplitsALongSequenceOverContextParallelRanks
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=[0-9]+ fit; the fastest:\n 1\\. TP [0-9]+ x PP 1 x DP [0-9]+ x CP [0-9]+, micro batch 1[^\n]*why: CP [0-9]+ does not fit TP [0-9]+ x PP 1 at any micro batch \\(at least [0-9.]+ GiB\\)"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan>
            --nodes 1 --set model.hidden_size=1024 --set model.num_attention_heads=4
            --set model.num_layers=1 --set data.seq_length=1048576
            --set model.max_position_embeddings=1048576 --set data.global_batch_size=32
            --set data.micro_batch_size=1 --set distributed_strategy.tensor_model_parallel_size=1
            --search)
  # --search with expert parallelism: 8 experts of 3 x 2048 x 98304 f32 weights (4.8B
  # parameters, 38.6 GiB with their gradients; 19.9 GiB at TP 2, which splits each expert) fit
  # no NeuronCore at EP 1, ZeRO-1 or not; the fastest layouts split them (about 1 s)
  add_test(NAME NxdPlan.SearchSplitsExpertsThatDoNotFit
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=fit; the fastest:\n 1\\. TP [0-9]+ x PP 1 x DP [0-9]+, EP [0-9]+, micro batch 1[^\n]*why: [^\n]*EP 1 does not fit \\(at least [0-9.]+ GiB\\)"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan>
            --nodes 1 --set model.arch=mixtral --set model.moe.num_experts=8
            --set model.moe.top_k=2 --set model.hidden_size=2048 --set model.num_attention_heads=2
            --set model.num_kv_heads=2 --set model.ffn_hidden_size=98304 --set model.num_layers=1
            --set data.seq_length=256 --set data.global_batch_size=32
            --set data.micro_batch_size=1 --set precision.type=fp32
            --set distributed_strategy.sequence_parallel=false --search)
  # the mixtral-8x7b preset (2 of its 32 layers) plans at TP 4, EP 8 with ZeRO-1, and says the
  # routing it assumes
  add_test(NAME NxdPlan.MixtralPresetPlans
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=mixtral-8x7b on trn1.32xlarge \\(32 NeuronCores\\): TP 4 x PP 1 x DP 8, EP 8,.*memory plan: the experts' tokens are planned evenly routed \\(2 of 8 per token\\); dropless, a run's busiest expert-parallel rank holds more.*predicted: [0-9.]+ seq/s.*\\(fits\\)"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan>
            --model mixtral-8x7b --set model.num_layers=2
            --set distributed_strategy.expert_model_parallel_size=8
            --set distributed_strategy.tensor_model_parallel_size=4 --set data.seq_length=4096
            --set data.global_batch_size=8 --set data.micro_batch_size=1
            --set precision.type=mixed_precision --set distributed_strategy.zero1=true)
  set_tests_properties(NxdPlan.PlansTwoHundredFiftySixRanks NxdPlan.ConfiguredLayoutDoesNotFit
    NxdPlan.SearchFindsLayoutsThatFit NxdPlan.UnknownModelIsAUserMistake NxdPlan.Gpt3PresetPlans
    NxdPlan.SearchSplitsALongSequenceOverContextParallelRanks
    NxdPlan.SearchSplitsExpertsThatDoNotFit NxdPlan.MixtralPresetPlans
    PROPERTIES LABELS tools TIMEOUT 300)
endif()
