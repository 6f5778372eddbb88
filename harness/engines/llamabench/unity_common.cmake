# Included by CMake after each project() of the llama.cpp tree (CMAKE_PROJECT_INCLUDE, set by
# build.py). llama-common is some 50 C++ files that each parse the same large headers (the JSON
# library, the chat templates); compiled as a few unity sources of 8 files each it builds in
# a fraction of the time. Only llama-common: ggml's CPU sources redefine each other's static
# helpers and cannot share a translation unit; and json.cpp stays on its own (it specialises
# templates that the other files instantiate). Deferred to the end of the top directory,
# where the target exists.
if(PROJECT_NAME STREQUAL "llama.cpp")
  cmake_language(DEFER CALL set_target_properties llama-common PROPERTIES
                 UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 8)
  cmake_language(DEFER CALL set_source_files_properties
                 "${CMAKE_CURRENT_SOURCE_DIR}/common/json.cpp" TARGET_DIRECTORY llama-common
                 PROPERTIES SKIP_UNITY_BUILD_INCLUSION ON)
endif()
