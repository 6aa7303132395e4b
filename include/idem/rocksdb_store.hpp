// idem/rocksdb_store.hpp: kept so that existing includes work; the store lives in idem/stores/rocksdb_store.hpp.
#pragma once
#include "idem/stores/rocksdb_store.hpp"  // IWYU pragma: export
