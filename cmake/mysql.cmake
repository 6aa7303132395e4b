# idem::mysql: the MySQL / MariaDB store (include/idem/stores/mysql_store.hpp), header-only over
# MariaDB Connector/C (Debian libmariadb-dev; it speaks to MariaDB and MySQL alike), found with
# pkg-config. The imported target is GLOBAL so tests/, tools/ and bench/ see it; idemConfig.cmake
# recreates it under the same name for consumers of an installed idem that ask for `mysql`.
# On by default in idem's own build (required there: its tests run on MariaDB); a project that
# add_subdirectory()s idem gets it when the connector is found.
find_package(PkgConfig QUIET)
if(PKG_CONFIG_FOUND)
  pkg_check_modules(IDEM_MARIADB QUIET IMPORTED_TARGET GLOBAL libmariadb)
endif()
if(IDEM_MAIN_PROJECT OR IDEM_MARIADB_FOUND)
  set(_idem_default ON)
else()
  set(_idem_default OFF)
endif()
option(IDEM_WITH_MYSQL "Build the MySQL/MariaDB store target idem::mysql" ${_idem_default})
if(IDEM_WITH_MYSQL)
  if(NOT IDEM_MARIADB_FOUND)
    message(FATAL_ERROR "IDEM_WITH_MYSQL is on but pkg-config found no libmariadb (Debian: libmariadb-dev, "
                        "pkg-config); configure with -DIDEM_WITH_MYSQL=OFF to build without idem::mysql")
  endif()
  add_library(idem_mysql INTERFACE)
  add_library(idem::mysql ALIAS idem_mysql)
  set_target_properties(idem_mysql PROPERTIES EXPORT_NAME mysql)
  target_link_libraries(idem_mysql INTERFACE idem::idem PkgConfig::IDEM_MARIADB)
  # global_guard.hpp compiles the arbiters whose targets are linked (detail/global/open_session.hpp).
  target_compile_definitions(idem_mysql INTERFACE IDEM_HAVE_MYSQL=1)
  list(APPEND _idem_exported_components mysql)
endif()
