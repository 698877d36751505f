#pragma once
// A class of modules: the C++ form of NxD's module-class arguments
// (activation_checkpoint_config=<class>, pad_model's wrapped_classes). Python names a class;
// C++ names a type (ModuleClass::of<MyBlock>(), matching MyBlock and its subclasses by
// dynamic_cast) or any predicate over a module (ModuleClass::where). Its name is what errors
// print: of<T>() uses T's demangled name unless one is given.
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "nxd/layers/module.h"

namespace nxd {

struct ModuleClass {
  std::string name;
  std::function<bool(const Module&)> matches;

  template <class M>
  static ModuleClass of(std::string name = "") {
    return {name.empty() ? demangled_type_name(typeid(M).name()) : std::move(name),
            [](const Module& m) { return dynamic_cast<const M*>(&m) != nullptr; }};
  }
  // InvalidArgument when `name` is empty or `pred` is null.
  static ModuleClass where(std::string name, std::function<bool(const Module&)> pred);
  // The modules whose type_name() is `type_name` (the name a layer gives Module's constructor).
  static ModuleClass named(const std::string& type_name);

  static std::string demangled_type_name(const char* mangled);
};

// Every instance of `cls` in `model` (the model itself included), pre-order with hierarchical
// names. Empty when none matches.
std::vector<std::pair<std::string, Module*>> instances_of(Module& model, const ModuleClass& cls);

// The same, or InvalidArgument "[op] no module of class <name> in the model (its classes: ...)"
// naming the model's own classes when none matches.
std::vector<std::pair<std::string, Module*>> require_instances(Module& model,
                                                               const ModuleClass& cls,
                                                               const char* op);

}  // namespace nxd
