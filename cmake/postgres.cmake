# idem::postgres: the PostgreSQL store (include/idem/postgres_store.hpp), header-only over libpqxx.
# libpqxx is found with pkg-config (Debian 12: libpqxx-dev 6.4, which links libpq itself).
# Include after the idem target and the IDEM_INSTALL option are defined.
find_package(PkgConfig REQUIRED)
pkg_check_modules(IDEM_PQXX REQUIRED IMPORTED_TARGET GLOBAL libpqxx)

add_library(idem_postgres INTERFACE)
add_library(idem::postgres ALIAS idem_postgres)
set_target_properties(idem_postgres PROPERTIES EXPORT_NAME postgres)
target_link_libraries(idem_postgres INTERFACE idem::idem PkgConfig::IDEM_PQXX)

if(IDEM_INSTALL)
  install(TARGETS idem_postgres EXPORT idemTargets)
endif()
