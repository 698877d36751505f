# The simulated Neuron device: machine specs, per-rank clock, timeline.
set(NXD_SIM_DEVICE_SOURCES sim/machine.cpp sim/clock.cpp sim/timeline.cpp)
