#pragma once
// All differentiable ops: #include "nxd/autograd/ops.h".
#include "nxd/autograd/function.h"
#include "nxd/autograd/graph.h"
#include "nxd/autograd/ops/basic.h"
#include "nxd/autograd/ops/nn.h"
