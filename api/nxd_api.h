#pragma once
// api/ (library nxd_api): NxD's training API, the lowest of the three ways to train (docs/MAP.md).
// It turns a user's model and optimizer into parallel ones and runs their step NxD's way, and
// nothing more: no loop, no data, no logs, no checkpoints. nxd_config.h sets up the parallel
// layout (parallel_state) and precision, nxd_model.h wraps the model (pipeline stages, the
// forward/backward of a step), nxd_optimizer.h wraps the optimizer (DP gradient buckets or
// ZeRO-1, SP gradient sums, clipping, mixed precision). It links pipeline, optim and layers, and
// nothing in it includes the Trainer (trainer/) or nxd-train (train_app/), which are built on it.
//
// NxD's training API in C++ (the API guide's "Neuronx-Distributed Training APIs"): for a research
// prototype that writes its own model and loop, the parallel layout, the model and the optimizer
// step NxD's way, without wiring parallel_state, gradient buckets, ZeRO-1, mixed precision and
// clipping by hand.
//
//   NxDConfig want;
//   want.tensor_parallel_size = 2;
//   want.optimizer_config.zero_one_enabled = true;
//   want.precision = "mixed_precision";
//   const NxDConfig cfg = neuronx_distributed_config(want);          // nxd_config.h
//   auto model = initialize_parallel_model(cfg, model_fn);           // nxd_model.h
//   auto opt = initialize_parallel_optimizer(cfg, *model, groups,    // nxd_optimizer.h
//                                            optim::AdamWOptions{});
//   for (...) { model->run_train(loss_fn); opt->step(); opt->zero_grad(); }
//
// The Trainer (trainer.h) and nxd-train run on these same three pieces.
#include "nxd/api/nxd_config.h"
#include "nxd/api/nxd_model.h"
#include "nxd/api/nxd_optimizer.h"
