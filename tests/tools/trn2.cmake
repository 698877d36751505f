# Trainium2 in the tools (docs/HARDWARE.md, "Trainium2"): a tiny nxd-train run on a few ranks of
# the trn2.48xlarge sim trains and measures its HBM against the trn2 logical core's 24 GiB (12 at
# LNC=1); nxd-plan plans on trn2 (the same plan twice, the same numbers), searches it, and plans
# the UltraServer; an unknown instance is a user mistake (exit 2) that names the known ones.
set(_tiny --set model.hidden_size=64 --set model.num_attention_heads=4 --set model.num_layers=2
          --set data.seq_length=32 --set data.global_batch_size=8 --set data.micro_batch_size=1
          --set trainer.max_steps=3)
if(TARGET nxd-train)
  set(_trn2_out ${CMAKE_CURRENT_BINARY_DIR}/trn2_runs)
  add_test(NAME NxdTrain.Trn2RunsClean COMMAND ${CMAKE_COMMAND} -E rm -rf ${_trn2_out})
  set_tests_properties(NxdTrain.Trn2RunsClean PROPERTIES FIXTURES_SETUP trn2_runs LABELS tools)
  add_test(NAME NxdTrain.TrainsOnTrn2
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=of 24.00 GiB HBM \\(trn2.48xlarge\\).*modeled on trn2.48xlarge: [0-9.]+ ms/step \\([0-9]+ tokens/s\\), HBM peak [0-9.]+ MiB per NeuronCore"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-train>
            ${_tiny} --set backend.instance=trn2.48xlarge --set backend.world_size=4
            --set distributed_strategy.tensor_model_parallel_size=2 --out ${_trn2_out}/lnc2)
  add_test(NAME NxdTrain.TrainsOnTrn2AtLnc1
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=of 12.00 GiB HBM \\(trn2.48xlarge:lnc=1\\).*modeled on trn2.48xlarge:lnc=1: [0-9.]+ ms/step"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-train>
            ${_tiny} --set backend.instance=trn2.48xlarge:lnc=1 --set backend.world_size=4
            --set distributed_strategy.tensor_model_parallel_size=2 --out ${_trn2_out}/lnc1)
  add_test(NAME NxdTrain.UnknownInstanceNamesTheKnownOnes
    COMMAND ${CMAKE_COMMAND} -DCODE=2
            "-DREGEX=unknown instance type 'trn9.48xlarge'; known: trn1.2xlarge.* trn2.48xlarge trn2u.48xlarge trn2u"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-train>
            ${_tiny} --set backend.instance=trn9.48xlarge --set backend.world_size=2
            --out ${_trn2_out}/unknown)
  set_tests_properties(NxdTrain.TrainsOnTrn2 NxdTrain.TrainsOnTrn2AtLnc1
    NxdTrain.UnknownInstanceNamesTheKnownOnes PROPERTIES LABELS tools TIMEOUT 120
    FIXTURES_REQUIRED trn2_runs)
endif()
if(TARGET nxd-plan)
  set(_plan2 --instance trn2.48xlarge --nodes 2 --set model.hidden_size=512
             --set model.num_attention_heads=8 --set model.num_layers=4 --set data.seq_length=512
             --set data.global_batch_size=128 --set data.micro_batch_size=1
             --set distributed_strategy.tensor_model_parallel_size=4
             --set distributed_strategy.pipeline_model_parallel_size=2
             --set precision.type=mixed_precision)
  add_test(NAME NxdPlan.Trn2PlanIsDeterministic
    COMMAND ${CMAKE_COMMAND}
            "-DREGEX=on 2xtrn2.48xlarge \\(128 NeuronCores\\): TP 4 x PP 2 x DP 16.*of 24.00 GiB HBM \\(2xtrn2.48xlarge\\).*predicted: [0-9.]+ seq/s, [0-9]+ tokens/s, MFU [0-9.]+, step [0-9.]+ s, memory [0-9.]+ GiB of 24.00 GiB per core \\(fits\\)"
            "-DIGNORE=planner: [^\n]*|\\([0-9]+ m?s on meta tensors\\)"
            -P ${CMAKE_SOURCE_DIR}/tests/support/same_output_twice.cmake $<TARGET_FILE:nxd-plan>
            ${_plan2})
  add_test(NAME NxdPlan.Trn2SearchFindsLayouts
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=[0-9]+ fit; the fastest:\n 1\\. TP [0-9]+ x PP [0-9]+ x DP [0-9]+"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan>
            --instance trn2.48xlarge --set model.hidden_size=1024 --set model.num_attention_heads=8
            --set model.num_layers=2 --set data.seq_length=2048 --set data.global_batch_size=64
            --set data.micro_batch_size=1 --search)
  add_test(NAME NxdPlan.PlansATrn2UltraServer
    COMMAND ${CMAKE_COMMAND} -DCODE=0
            "-DREGEX=on trn2u \\(256 NeuronCores\\): TP 8 x PP 1 x DP 32.*predicted: [0-9.]+ seq/s.*\\(fits\\)"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan>
            --instance trn2u --set model.hidden_size=512 --set model.num_attention_heads=8
            --set model.num_layers=2 --set data.seq_length=256 --set data.global_batch_size=64
            --set data.micro_batch_size=1 --set distributed_strategy.tensor_model_parallel_size=8)
  add_test(NAME NxdPlan.UnknownInstanceNamesTheKnownOnes
    COMMAND ${CMAKE_COMMAND} -DCODE=2
            "-DREGEX=unknown instance type 'trn9.48xlarge'; known: trn1.2xlarge.* trn2.48xlarge trn2u.48xlarge trn2u"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan>
            --instance trn9.48xlarge)
  add_test(NAME NxdPlan.LncOnTrn1IsAUserMistake
    COMMAND ${CMAKE_COMMAND} -DCODE=2
            "-DREGEX=logical NeuronCores \\(:lnc=\\) exist on Trainium2 and Trainium3 only"
            -P ${CMAKE_SOURCE_DIR}/tests/support/expect_exit.cmake $<TARGET_FILE:nxd-plan>
            --instance trn1.32xlarge:lnc=1)
  set_tests_properties(NxdPlan.Trn2PlanIsDeterministic NxdPlan.Trn2SearchFindsLayouts
    NxdPlan.PlansATrn2UltraServer NxdPlan.UnknownInstanceNamesTheKnownOnes
    NxdPlan.LncOnTrn1IsAUserMistake PROPERTIES LABELS tools TIMEOUT 300)
endif()
