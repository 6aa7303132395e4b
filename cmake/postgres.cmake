# idem::postgres: the PostgreSQL store (include/idem/postgres_store.hpp), header-only over libpqxx.
# libpqxx is found with pkg-config (Debian 12: libpqxx-dev 6.4 and pkg-config; libpqxx.so links
# libpq itself). The imported target is GLOBAL so tests/, tools/ and bench/ see it; idemConfig.cmake
# recreates it under the same name for consumers of an installed idem that ask for `postgres`.
# On by default in idem's own build (required there); a project that add_subdirectory()s idem gets
# it when libpqxx is found.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(IDEM_PQXX QUIET IMPORTED_TARGET GLOBAL libpqxx)
endif()
if(IDEM_MAIN_PROJECT OR IDEM_PQXX_FOUND)
  set(_idem_default ON)
else()
  set(_idem_default OFF)
endif()
option(IDEM_WITH_POSTGRES "Build the PostgreSQL store target idem::postgres" ${_idem_default})
if(IDEM_WITH_POSTGRES)
  if(NOT IDEM_PQXX_FOUND)
    message(FATAL_ERROR "IDEM_WITH_POSTGRES is on but pkg-config found no libpqxx (Debian: libpqxx-dev, "
                        "pkg-config); configure with -DIDEM_WITH_POSTGRES=OFF to build without idem::postgres")
  endif()
  add_library(idem_postgres INTERFACE)
  add_library(idem::postgres ALIAS idem_postgres)
  set_target_properties(idem_postgres PROPERTIES EXPORT_NAME postgres)
  target_link_libraries(idem_postgres INTERFACE idem::idem PkgConfig::IDEM_PQXX)
  # global_guard.hpp compiles the arbiters whose targets are linked (detail/global/open_session.hpp).
  target_compile_definitions(idem_postgres INTERFACE IDEM_HAVE_POSTGRES=1)
  list(APPEND _idem_exported_components postgres)
endif()
