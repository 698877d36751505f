# The simulated Neuron device: machine specs, collective cost model, per-rank clock, timeline.
set(NXD_SIM_DEVICE_SOURCES sim/machine.cpp sim/collective_cost.cpp sim/clock.cpp sim/timeline.cpp)
