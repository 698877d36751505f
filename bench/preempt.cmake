# nxd-bench-preempt: the per-step cost of the preemption check (one i32 all-reduce per step).
add_executable(nxd-bench-preempt preempt.cpp)
target_link_libraries(nxd-bench-preempt PRIVATE nxd_train_app)
nxd_compile_options(nxd-bench-preempt)
