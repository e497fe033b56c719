// blochsim C++ API: include this one header.
//
//   blochsim::EventStream s;  ... fill the event arrays (events.hpp) ...
//   blochsim::Tissue t;       ... point at T1_s, T2_s, ... arrays ...
//   std::vector<std::complex<float>> out(t.n * s.n_samples);
//   blochsim::host::forward(s, t, reinterpret_cast<float*>(out.data()), threads);
#pragma once

#include "config.hpp"
#include "epg/epg.hpp"
#include "events.hpp"
#include "host/epg.hpp"
#include "host/keyed.hpp"
#include "host/perk.hpp"
#include "host/pools.hpp"
#include "perk.hpp"
#include "pools/lineshape.hpp"
#include "pools/pools.hpp"
#include "tile.hpp"

#define BLOCHSIM_VERSION_MAJOR 0
#define BLOCHSIM_VERSION_MINOR 1
#define BLOCHSIM_VERSION_PATCH 0
