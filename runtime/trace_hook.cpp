#include "nxd/runtime/trace_hook.h"

#include "nxd/runtime/context.h"

namespace nxd {

namespace {
const AttrValue& find_attr(const OpAttrs& a, const std::string& k) {
  for (const auto& [key, v] : a.items)
    if (key == k) return v;
  throw InvalidArgument(str("[OpAttrs] no attribute '", k, "'"));
}
template <class T>
const T& get_attr(const OpAttrs& a, const std::string& k, const char* type) {
  const AttrValue& v = find_attr(a, k);
  const T* p = std::get_if<T>(&v);
  NXD_CHECK(p, "[OpAttrs] attribute '", k, "' is not ", type);
  return *p;
}
}  // namespace

bool OpAttrs::has(const std::string& k) const {
  for (const auto& kv : items)
    if (kv.first == k) return true;
  return false;
}
int64_t OpAttrs::i(const std::string& k) const {
  return get_attr<int64_t>(*this, k, "an integer");
}
double OpAttrs::f(const std::string& k) const {
  return get_attr<double>(*this, k, "a real");
}
const std::string& OpAttrs::s(const std::string& k) const {
  return get_attr<std::string>(*this, k, "a string");
}
const std::vector<int64_t>& OpAttrs::ints(const std::string& k) const {
  return get_attr<std::vector<int64_t>>(*this, k, "a list of integers");
}

OpRecorder* active_recorder() {
  TraceSlot* s = current_context().find_ext<TraceSlot>();
  return s ? s->recorder : nullptr;
}

void check_host_read(const char* what, const Tensor& t) {
  if (OpRecorder* r = active_recorder()) r->host_read(what, t, r->depth);
}

}  // namespace nxd
