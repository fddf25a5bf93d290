// Distributed training: process groups and collectives (NCCL on CUDA, the group's store on the
// CPU), DataParallel and DistributedSampler. Not included by kiln.hpp or nn.hpp: include it where
// a program runs on several processes (start them with tools/kilnrun).
#pragma once

#include "kiln/nn.hpp"
#include "kiln/dist/ddp.hpp"
#include "kiln/dist/process_group.hpp"
#include "kiln/dist/store.hpp"
