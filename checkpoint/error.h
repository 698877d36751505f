#pragma once
// checkpoint/'s name for the I/O floor's file error (io/fileio.h): a checkpoint that cannot be
// read or written as expected (truncated, corrupted, missing, mismatched). Tools exit with code 2.
#include "nxd/io/fileio.h"

namespace nxd::ckpt {

using CheckpointError = io::FileError;

}  // namespace nxd::ckpt
