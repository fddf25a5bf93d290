// Neural-network layers and model I/O: nn::Linear, LayerNorm, Embedding, MultiheadAttention, the
// BERT encoder layer, Conv2d, pooling, BatchNorm2d; safetensors and .npy files. kiln.hpp does not
// include this (a program that only computes does not parse it); BertModel and the tokenizer are
// <kiln/nn/bert.hpp> and <kiln/nn/tokenizer.hpp>.
#pragma once

#include "kiln/kiln.hpp"
#include "kiln/nn/conv.hpp"
#include "kiln/nn/io.hpp"
#include "kiln/nn/layers.hpp"
#include "kiln/nn/train.hpp"
