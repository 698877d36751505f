#pragma once
// parallel_state: NxD's process groups (neuronx_distributed/parallel_layers/parallel_state.py).
// Ranks are laid out as arange(world).reshape(PP, DP, TP): TP varies fastest (stride 1), then DP
// (stride TP), PP slowest (stride TP*DP), with DP = world / (TP*PP). The TP group of a rank is
// [pp, dp, :], its DP group [pp, :, tp], its PP group [:, dp, tp]. Example, 32 ranks TP8 PP4:
// TP groups [0..7], [8..15], ...; PP groups [0,8,16,24], [1,9,17,25], ...
//
// State is per rank (kept in the current Context), never process-global: in the sim backend
// every rank thread has its own. Getters before initialize_model_parallel throw ConfigError,
// except in a world of one rank, which is implicitly initialized with TP=PP=1.
#include <memory>
#include <vector>

#include "nxd/collectives/communicator.h"

namespace nxd::parallel_state {

using Groups = std::vector<std::vector<int>>;

// The group tables alone (NxD's mesh_only): throws ConfigError if tp*pp does not divide world.
struct Layout {
  int world = 1, tp = 1, pp = 1, dp = 1;
  Groups tp_groups, dp_groups, pp_groups;
};
Layout make_layout(int world_size, int tensor_model_parallel_size,
                   int pipeline_model_parallel_size = 1);

// Builds the groups over the current world communicator (collective: every rank calls it).
// Throws ConfigError if the world does not divide or the state is already initialized.
void initialize_model_parallel(int tensor_model_parallel_size = 1,
                               int pipeline_model_parallel_size = 1);
bool model_parallel_is_initialized();
void destroy_model_parallel();
const Layout& get_layout();

int get_tensor_model_parallel_size();
int get_tensor_model_parallel_rank();
Communicator& get_tensor_model_parallel_group();
std::shared_ptr<Communicator> get_tensor_model_parallel_group_ptr();
Groups get_tensor_model_parallel_replica_groups();

int get_data_parallel_size();
int get_data_parallel_rank();
Communicator& get_data_parallel_group();
std::shared_ptr<Communicator> get_data_parallel_group_ptr();
Groups get_data_parallel_replica_groups();

int get_pipeline_model_parallel_size();
int get_pipeline_model_parallel_rank();
Communicator& get_pipeline_model_parallel_group();
std::shared_ptr<Communicator> get_pipeline_model_parallel_group_ptr();
Groups get_pipeline_model_parallel_replica_groups();
// Global ranks of the next / previous stage in this rank's PP group (wrapping around).
int get_pipeline_model_parallel_next_rank();
int get_pipeline_model_parallel_prev_rank();
bool is_pipeline_first_stage();
bool is_pipeline_last_stage();

}  // namespace nxd::parallel_state
