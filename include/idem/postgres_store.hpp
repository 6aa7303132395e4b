// idem/postgres_store.hpp: kept so that existing includes work; the store lives in idem/stores/postgres_store.hpp.
#pragma once
#include "idem/stores/postgres_store.hpp"  // IWYU pragma: export
