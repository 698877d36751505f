#include "nxd/optim/zero3_unit.h"

#include "nxd/runtime/error.h"

namespace nxd::optim {

ShardedUnit::ShardedUnit(std::shared_ptr<Communicator> dp, bool reshard_after_forward)
    : dp_(std::move(dp)), reshard_(reshard_after_forward) {}

void ShardedUnit::add_bucket(Tensor full, Tensor shard) {
  NXD_CHECK(full.numel() == shard.numel() * dp_->size() && full.dtype() == shard.dtype(),
            "[ShardedUnit] full buffer ", full.desc(), " is not ", dp_->size(), " x the shard ",
            shard.desc());
  full_.push_back(std::move(full));
  shard_.push_back(std::move(shard));
}

void ShardedUnit::set_neighbours(std::weak_ptr<ShardedUnit> prev, std::weak_ptr<ShardedUnit> next) {
  prev_ = std::move(prev);
  next_ = std::move(next);
}

void ShardedUnit::start() {
  NoGradGuard ng;
  work_.clear();
  for (size_t b = 0; b < full_.size(); ++b) {
    full_[b].storage()->reallocate();
    work_.push_back(dp_->iall_gather(shard_[b], full_[b]));
  }
  state_ = State::in_flight;
}

void ShardedUnit::wait() {
  for (Work& w : work_) w.wait();
  work_.clear();
  state_ = State::gathered;
}

void ShardedUnit::prefetch(const std::weak_ptr<ShardedUnit>& u) {
  if (auto p = u.lock(); p && p->state_ == State::released) p->start();
}

void ShardedUnit::materialize() {
  if (state_ == State::released) start();
  wait();
}

void ShardedUnit::gather(UnitPass pass) {
  materialize();
  prefetch(pass == UnitPass::forward ? next_ : prev_);
}

void ShardedUnit::release(UnitPass) {
  if (state_ == State::released) return;
  wait();
  for (Tensor& f : full_) f.storage()->release_data();
  state_ = State::released;
}

void ShardedUnit::write_back_and_release() {
  if (state_ == State::released) return;
  wait();
  NoGradGuard ng;
  const int64_t r = dp_->rank();
  for (size_t b = 0; b < full_.size(); ++b)
    if (!full_[b].is_meta())
      shard_[b].copy_(full_[b].narrow(0, r * shard_[b].numel(), shard_[b].numel()));
  release(UnitPass::forward);
}

}  // namespace nxd::optim
