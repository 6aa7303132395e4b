// tests/support/pg_fixture.hpp: a GoogleTest fixture whose every test gets a fresh PostgreSQL
// database (pg_database.hpp): created in SetUp, which fails the test when there is no server, and
// dropped in TearDown. A test reads the server's URI, the database's name and its URI.
#pragma once

#include <gtest/gtest.h>

#include <string>

#include "pg_database.hpp"

namespace idem_test {

class pg_fixture : public ::testing::Test {
protected:
    void SetUp() override {
        std::string why;
        ASSERT_TRUE(database_.create(&why)) << why;
        server_ = database_.server();
        db_ = database_.name();
        uri_ = database_.uri();
    }
    void TearDown() override {
        std::string why;
        EXPECT_TRUE(database_.drop(&why)) << why;
    }

    pg_database database_;
    std::string server_, db_, uri_;  ///< the server's URI, the database's name, the database's URI
};

}  // namespace idem_test
