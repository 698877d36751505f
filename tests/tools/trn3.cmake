# Trainium3 in the tools (docs/HARDWARE.md, "Trainium3"): a tiny nxd-train run on a few ranks of
# the Trn3 Gen1 UltraServer sim measures its HBM against the Trn3 logical core's 36 GiB; nxd-plan
# plans on both Trn3 UltraServers (the same plan twice, the same numbers) and models inference on
# one; what AWS does not publish is refused as a user mistake (exit 2) naming what is unknown: a
# Trn3 instance size, a cluster of UltraServers, optimizer offload (the host side). nxd-generate's
# --instance trn3-gen1 and its refusal of trn3.48xlarge: nxd_generate_test.cpp.
set(_tiny3 --set model.hidden_size=64 --set model.num_attention_heads=4 --set model.num_layers=2
           --set data.seq_length=32 --set data.global_batch_size=8 --set data.micro_batch_size=1
           --set trainer.max_steps=3)
set(_exit ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake)
set(_unpublished "AWS publishes no Trn3 instance size \\(its chips, topology and EFA per instance are unknown\\); nxd models the Trn3 UltraServers only: trn3-gen1")
if(TARGET nxd-train)
  set(_trn3_out ${CMAKE_CURRENT_BINARY_DIR}/trn3_runs)
  add_test(NAME NxdTrain.Trn3RunsClean COMMAND ${CMAKE_COMMAND} -E rm -rf ${_trn3_out})
  set_tests_properties(NxdTrain.Trn3RunsClean PROPERTIES FIXTURES_SETUP trn3_runs LABELS tools)
  add_test(NAME NxdTrain.TrainsOnTrn3Gen1
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=of 36.00 GiB HBM \\(trn3-gen1\\).*modeled on trn3-gen1: [0-9.]+ ms/step \\([0-9]+ tokens/s\\), HBM peak [0-9.]+ MiB per NeuronCore"
            -P ${_exit} $<TARGET_FILE:nxd-train>
            ${_tiny3} --set backend.instance=trn3-gen1 --set backend.world_size=4
            --set distributed_strategy.tensor_model_parallel_size=2 --out ${_trn3_out}/gen1)
  add_test(NAME NxdTrain.Trn3InstanceSizeIsRefused
    COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX='trn3.48xlarge': ${_unpublished}"
            -P ${_exit} $<TARGET_FILE:nxd-train>
            ${_tiny3} --set backend.instance=trn3.48xlarge --set backend.world_size=2
            --out ${_trn3_out}/unpublished)
  set_tests_properties(NxdTrain.TrainsOnTrn3Gen1 NxdTrain.Trn3InstanceSizeIsRefused PROPERTIES
    LABELS tools TIMEOUT 120 FIXTURES_REQUIRED trn3_runs)
endif()
if(TARGET nxd-plan)
  set(_plan3 --set model.hidden_size=512 --set model.num_attention_heads=8
             --set model.num_layers=2 --set data.seq_length=256 --set data.micro_batch_size=1
             --set distributed_strategy.tensor_model_parallel_size=8
             --set precision.type=mixed_precision)
  add_test(NAME NxdPlan.Trn3Gen1PlanIsDeterministic
    COMMAND ${CMAKE_COMMAND}
            "-DREGEX=on trn3-gen1 \\(256 NeuronCores\\): TP 8 x PP 1 x DP 32.*of 36.00 GiB HBM \\(trn3-gen1\\).*predicted: [0-9.]+ seq/s, [0-9]+ tokens/s, MFU [0-9.]+, step [0-9.]+ s, memory [0-9.]+ GiB of 36.00 GiB per core \\(fits\\)"
            "-DIGNORE=planner: [^\n]*|\\([0-9]+ m?s on meta tensors\\)"
            -P ${CMAKE_SOURCE_DIR}/tests/support/same_output_twice.cmake $<TARGET_FILE:nxd-plan>
            --instance trn3-gen1 ${_plan3} --set data.global_batch_size=64)
  add_test(NAME NxdPlan.Trn3Gen2PlanIsDeterministic
    COMMAND ${CMAKE_COMMAND}
            "-DREGEX=on trn3-gen2 \\(576 NeuronCores\\): TP 8 x PP 1 x DP 72.*predicted: [0-9.]+ seq/s.*\\(fits\\)"
            "-DIGNORE=planner: [^\n]*|\\([0-9]+ m?s on meta tensors\\)"
            -P ${CMAKE_SOURCE_DIR}/tests/support/same_output_twice.cmake $<TARGET_FILE:nxd-plan>
            --instance trn3-gen2 ${_plan3} --set data.global_batch_size=144)
  add_test(NAME NxdPlan.InferenceOnTrn3Gen1
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=llama3.1-8b on trn3-gen1 at TP 8, batch 1, 128 prompt \\+ 128 new tokens.*of 36.00 GiB HBM.*predicted inference: TTFT [0-9.]+ ms, TPOT [0-9.]+ ms, [0-9.]+ output tokens/s"
            -P ${_exit} $<TARGET_FILE:nxd-plan> --inference --model llama3.1-8b
            --instance trn3-gen1 --set distributed_strategy.tensor_model_parallel_size=8)
  add_test(NAME NxdPlan.Trn3InstanceSizeIsRefused
    COMMAND ${CMAKE_COMMAND} -DCODE=2 "-DREGEX='trn3.48xlarge': ${_unpublished}"
            -P ${_exit} $<TARGET_FILE:nxd-plan> --instance trn3.48xlarge)
  add_test(NAME NxdPlan.Trn3UltraServersAreNotClustered
    COMMAND ${CMAKE_COMMAND} -DCODE=2
            "-DREGEX=trn3-gen1 is an UltraServer \\(one scale-up domain\\); clusters of UltraServers are not modeled"
            -P ${_exit} $<TARGET_FILE:nxd-plan> --instance trn3-gen1 --nodes 2)
  add_test(NAME NxdPlan.Trn3OffloadIsRefused
    COMMAND ${CMAKE_COMMAND} -DCODE=2
            "-DREGEX=optimizer offload on trn3-gen1 is not modeled: AWS publishes neither the Trainium3 chips' host link nor the Trn3 hosts' memory bandwidth"
            -P ${_exit} $<TARGET_FILE:nxd-plan> --instance trn3-gen1 ${_plan3}
            --set data.global_batch_size=64 --set distributed_strategy.zero_stage=1
            --set distributed_strategy.optimizer_offload=true)
  set_tests_properties(NxdPlan.Trn3Gen1PlanIsDeterministic NxdPlan.Trn3Gen2PlanIsDeterministic
    NxdPlan.InferenceOnTrn3Gen1 NxdPlan.Trn3InstanceSizeIsRefused
    NxdPlan.Trn3UltraServersAreNotClustered NxdPlan.Trn3OffloadIsRefused
    PROPERTIES LABELS tools TIMEOUT 300)
endif()
