#pragma once
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
