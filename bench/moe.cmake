# nxd-bench-moe: an 8-expert top-2 model at EP 1/2/4 against the dense model of equal active
# parameters on the sim backend (host tokens/s, modeled step time, all-to-all's share).
add_executable(nxd-bench-moe moe.cpp)
target_link_libraries(nxd-bench-moe PRIVATE nxd_train_app)
nxd_compile_options(nxd-bench-moe)
