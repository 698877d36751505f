#pragma once
// parallel_state: NxD's process groups (neuronx_distributed/parallel_layers/parallel_state.py),
// with Megatron-core's context- and expert-parallel groups added.
//
// Ranks are laid out as arange(world).reshape(PP, DP, CP, TP): TP varies fastest (stride 1), then
// CP (stride TP), then DP (stride TP*CP), PP slowest, with DP = world / (TP*CP*PP). The TP group
// of a rank is [pp, dp, cp, :], its CP group [pp, dp, :, tp], its DP group [pp, :, cp, tp], its PP
// group [:, dp, cp, tp]. With CP = 1 this is NxD's layout. Example, 32 ranks TP8 PP4: TP groups
// [0..7], [8..15], ...; PP groups [0,8,16,24], [1,9,17,25], ...
//
// Expert parallelism (Megatron-core's "MoE parallel folding": its expert RankGenerator has cp=1
// and expert-DP = world / (expert-TP x EP x PP), order tp-cp-ep-dp-pp) is folded into the data x
// context ranks of one (pp, tp): with q = dp * CP + cp the data x context rank, an EP group is EP
// consecutive q (q / EP fixed; EP divides DP x CP) and the expert-data-parallel group, over which
// expert parameters' gradients are averaged and their ZeRO-1 state sharded, is the q with the same
// q % EP. At CP 1 this is NxD's layout (EP consecutive DP indices, expert-DP strided). Why not EP
// inside each CP slice: every CP rank computes a different part of every expert's gradient (its
// own tokens), so the expert-DP group must reach across CP anyway; folding EP over DP x CP as well
// makes EP x expert-DP tile the data x context group (the 1/EP gradient scale then gives the
// DP x CP mean), lets EP grow to DP x CP (CP 2 x EP 2 at DP 1), keeps the all-to-all on ranks
// TP apart (nearest first), and lays a CP run's experts and their ZeRO-1 parts out in a checkpoint
// exactly as a CP 1 run with DP x CP data-parallel ranks. Context parallelism splits each
// sequence, so dense gradients are reduced over DP x CP (the data-context group); the DP group
// alone is the one whose ranks read different batches.
//
// State is per rank (kept in the current Context), never process-global: in the sim backend
// every rank thread has its own. Getters before initialize_model_parallel throw ConfigError,
// except in a world of one rank, which is implicitly initialized with every size 1.
#include <memory>
#include <vector>

#include "nxd/collectives/communicator.h"

namespace nxd::parallel_state {

using Groups = std::vector<std::vector<int>>;

// The degrees of parallelism; data parallelism is what is left of the world.
struct ParallelSizes {
  int tensor = 1;    // TP
  int pipeline = 1;  // PP
  int context = 1;   // CP: ranks that split one sequence
  int expert = 1;    // EP: ranks that split the experts (divides DP x CP)
};

// The group tables alone (NxD's mesh_only): throws ConfigError if tp*cp*pp does not divide the
// world or EP does not divide DP x CP.
struct Layout {
  int world = 1, tp = 1, pp = 1, dp = 1, cp = 1, ep = 1;
  Groups tp_groups, dp_groups, pp_groups;
  Groups cp_groups;         // [pp, dp, :, tp]
  Groups dp_cp_groups;      // [pp, :, :, tp]: DP x CP
  Groups ep_groups;         // EP consecutive data x context ranks q = dp * CP + cp
  Groups expert_dp_groups;  // the data x context ranks with the same q % EP
};
Layout make_layout(int world_size, const ParallelSizes& sizes);
Layout make_layout(int world_size, int tensor_model_parallel_size,
                   int pipeline_model_parallel_size = 1);

// Builds the groups over the current world communicator (collective: every rank calls it).
// Throws ConfigError if the world does not divide or the state is already initialized.
void initialize_model_parallel(const ParallelSizes& sizes);
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

int get_context_parallel_size();
int get_context_parallel_rank();
Communicator& get_context_parallel_group();
std::shared_ptr<Communicator> get_context_parallel_group_ptr();
Groups get_context_parallel_replica_groups();

// DP x CP: where dense gradients are reduced (and ZeRO-1 shards) when CP > 1. Rank = dp*CP + cp.
int get_data_context_parallel_size();
int get_data_context_parallel_rank();
Communicator& get_data_context_parallel_group();
std::shared_ptr<Communicator> get_data_context_parallel_group_ptr();
Groups get_data_context_parallel_replica_groups();

int get_expert_model_parallel_size();
int get_expert_model_parallel_rank();
Communicator& get_expert_model_parallel_group();
std::shared_ptr<Communicator> get_expert_model_parallel_group_ptr();
Groups get_expert_model_parallel_replica_groups();

// Where expert parameters' gradients are reduced (and their ZeRO-1 state sharded): DP x CP / EP
// ranks. Rank = (dp * CP + cp) / EP; the EP rank is (dp * CP + cp) % EP.
int get_expert_data_parallel_size();
int get_expert_data_parallel_rank();
Communicator& get_expert_data_parallel_group();
std::shared_ptr<Communicator> get_expert_data_parallel_group_ptr();
Groups get_expert_data_parallel_replica_groups();

}  // namespace nxd::parallel_state
