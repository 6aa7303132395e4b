# idem::postgres: the PostgreSQL store (include/idem/postgres_store.hpp), header-only over libpqxx.
# libpqxx is found with pkg-config (Debian 12: libpqxx-dev 6.4; libpqxx.so links libpq itself).
# The imported target is GLOBAL so tests/, tools/ and bench/ see it; idemConfig.cmake recreates it
# under the same name for consumers of an installed idem.
find_package(PkgConfig REQUIRED)
pkg_check_modules(IDEM_PQXX REQUIRED IMPORTED_TARGET GLOBAL libpqxx)

add_library(idem_postgres INTERFACE)
add_library(idem::postgres ALIAS idem_postgres)
set_target_properties(idem_postgres PROPERTIES EXPORT_NAME postgres)
target_link_libraries(idem_postgres INTERFACE idem::idem PkgConfig::IDEM_PQXX)
