// idem/sqlite_store.hpp: kept so that existing includes work; the store lives in idem/stores/sqlite_store.hpp.
#pragma once
#include "idem/stores/sqlite_store.hpp"  // IWYU pragma: export
