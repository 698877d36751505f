#include "nxd/layers/module_class.h"

#include <cxxabi.h>

#include <cstdlib>
#include <memory>
#include <set>

#include "nxd/runtime/error.h"

namespace nxd {

ModuleClass ModuleClass::where(std::string name, std::function<bool(const Module&)> pred) {
  NXD_CHECK(!name.empty(), "[ModuleClass::where] a module class needs a name for its errors");
  NXD_CHECK(pred != nullptr, "[ModuleClass::where] class ", name, " has no predicate");
  return {std::move(name), std::move(pred)};
}

ModuleClass ModuleClass::named(const std::string& type_name) {
  return where(type_name, [type_name](const Module& m) { return m.type_name() == type_name; });
}

std::string ModuleClass::demangled_type_name(const char* mangled) {
  int status = 0;
  std::unique_ptr<char, void (*)(void*)> d(abi::__cxa_demangle(mangled, nullptr, nullptr, &status),
                                           std::free);
  return status == 0 && d ? std::string(d.get()) : std::string(mangled);
}

std::vector<std::pair<std::string, Module*>> instances_of(Module& model, const ModuleClass& cls) {
  NXD_CHECK(cls.matches != nullptr, "[instances_of] class ", cls.name, " has no predicate");
  std::vector<std::pair<std::string, Module*>> out;
  for (auto& [name, m] : model.named_modules())
    if (cls.matches(*m)) out.emplace_back(name, m);
  return out;
}

std::vector<std::pair<std::string, Module*>> require_instances(Module& model,
                                                               const ModuleClass& cls,
                                                               const char* op) {
  auto found = instances_of(model, cls);
  if (found.empty()) {
    std::set<std::string> seen;
    std::string classes;
    for (auto& [name, m] : model.named_modules())
      if (seen.insert(m->type_name()).second)
        classes += (classes.empty() ? "" : ", ") + m->type_name();
    throw InvalidArgument(str("[", op, "] no module of class ", cls.name,
                              " in the model (its classes: ", classes, ")"));
  }
  return found;
}

}  // namespace nxd
