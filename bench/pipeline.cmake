# nxd-bench-pipeline: PP2 / PP4 / TP2 x PP2 x DP2 on the sim backend against one rank with the
# same batch and microbatches (host tokens/s ratio, modeled step time and bubble).
add_executable(nxd-bench-pipeline pipeline.cpp)
target_link_libraries(nxd-bench-pipeline PRIVATE nxd_pipeline)
nxd_compile_options(nxd-bench-pipeline)
