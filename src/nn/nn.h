// Public header of the model stage: the decoder (model.h) and its checkpoint names.
#pragma once

#include "nn/checkpoint_names.h"
#include "nn/model.h"
#include "nn/precision.h"
