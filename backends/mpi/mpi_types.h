// MPI datatypes and reduction ops for every meshfuse DataType. MPI has no 16-bit floats and its
// logical ops do not fit our byte-sized Bool, so Half, BFloat16 and Bool get 2- and 1-byte
// datatypes of their own plus user ops (commutative) that compute in float / as logic.
#pragma once
#include <mpi.h>

#include "backends/backend.h"
#include "runtime/dtype.h"

namespace meshfuse::mpi {

// Valid after MPI_Init; created once, on first use, and left to MPI_Finalize to reclaim.
MPI_Datatype datatypeFor(DataType dtype);
MPI_Op opFor(ReduceOp op, DataType dtype);

}  // namespace meshfuse::mpi
