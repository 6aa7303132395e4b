// idem/idem.hpp: the core library (memory-only guard). Stores have their own headers.
#pragma once

#include "idem/error.hpp"
#include "idem/guard.hpp"
#include "idem/guard_contract.hpp"
#include "idem/key.hpp"
#include "idem/options.hpp"
#include "idem/stats.hpp"
#include "idem/ticket.hpp"
#include "idem/transition.hpp"
