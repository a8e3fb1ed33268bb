# sdpa_plugin_host(TARGET): links TARGET (an executable) to sdpa so that backend plugins it
# loads (sdpa::load_backend, SDPA_BACKENDS) resolve sdpa's symbols against it: a static
# libsdpa is linked whole and its symbols exported (-rdynamic); a shared one as usual.
function(sdpa_plugin_host target)
  get_target_property(sdpa_type sdpa::sdpa TYPE)
  if(sdpa_type STREQUAL "STATIC_LIBRARY")
    target_link_libraries(${target} PRIVATE "$<LINK_LIBRARY:WHOLE_ARCHIVE,sdpa::sdpa>")
  else()
    target_link_libraries(${target} PRIVATE sdpa::sdpa)
  endif()
  set_target_properties(${target} PROPERTIES ENABLE_EXPORTS ON)
endfunction()
