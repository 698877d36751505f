#pragma once
// The MPI datatype of each nxd dtype, shared by the MPI backend and tools that call MPI directly
// (nxd-bench-collectives' raw-MPI baseline). Only with NXD_WITH_MPI: includes <mpi.h>.
#include <mpi.h>

#include "nxd/runtime/dtype.h"

namespace nxd::mpi {

// f32 MPI_FLOAT, f64 MPI_DOUBLE, i32 MPI_INT32_T, i64 MPI_INT64_T; bf16 is nxd's 2-byte
// contiguous type, which exists while an mpi::Session is alive (MPI_DATATYPE_NULL otherwise).
MPI_Datatype datatype(DType t);

}  // namespace nxd::mpi
