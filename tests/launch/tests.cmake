# torus-launch (python/torus/launch): every platform x instance x node count renders and passes its checks;
# each rule rejects a manifest or script that breaks it; --plan, --help, usage errors. Runs pytest on the
# build tree's copy of the package, loaded without torus/__init__.py: needs PyYAML and jsonschema, not the
# extension or torch.
add_test(NAME launch_render_check
         COMMAND ${TORUS_PYTHON_EXECUTABLE} -m pytest -p no:cacheprovider -q ${CMAKE_CURRENT_LIST_DIR})
set_tests_properties(launch_render_check PROPERTIES TIMEOUT 300 LABELS "unit;launch"
                     ENVIRONMENT "TORUS_LAUNCH_DIR=${PROJECT_BINARY_DIR}/python/torus/launch;PYTHONDONTWRITEBYTECODE=1")
# The bin/ wrapper runs the tool with python3.
add_test(NAME launch_wrapper_help COMMAND ${PROJECT_BINARY_DIR}/bin/torus-launch render --help)
set_tests_properties(launch_wrapper_help PROPERTIES TIMEOUT 60 LABELS "unit;launch"
                     PASS_REGULAR_EXPRESSION "usage: torus-launch render")
