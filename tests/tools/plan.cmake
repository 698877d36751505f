# nxd-train refuses a model that cannot fit before allocating anything (trainer/plan.h), exit 2
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
  set_tests_properties(NxdTrain.RefusesAOneRankModelOverHbm NxdTrain.RefusesAnEightRankModelOverHbm
    NxdTrain.RefusesARunOverTheSharedHostRam PROPERTIES LABELS tools TIMEOUT 60)
endif()
