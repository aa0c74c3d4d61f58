# pytest tests of the Python bindings, on every rank under mpirun.
if(TORUS_BUILD_PYTHON)
  foreach(_np 1 2 4)
    torus_add_mpi_test(NAME python_comm_np${_np} NP ${_np} LABELS "python" TIMEOUT 300
                       COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_pytest.sh ${TORUS_PYTHON_EXECUTABLE} ${PROJECT_BINARY_DIR}/python
                               ${CMAKE_CURRENT_LIST_DIR}/test_comm.py)
    # torus.pipeline (schedules, executor with Python callbacks) and torus.train (GPTTrainer vs one process).
    torus_add_mpi_test(NAME python_pipeline_np${_np} NP ${_np} LABELS "python;pipeline" TIMEOUT 400
                       COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_pytest.sh ${TORUS_PYTHON_EXECUTABLE} ${PROJECT_BINARY_DIR}/python
                               ${CMAKE_CURRENT_LIST_DIR}/test_pipeline.py)
  endforeach()
  # Mixture of experts from Python: ep layouts against dp, routing statistics.
  foreach(_np 1 2)
    torus_add_mpi_test(NAME python_moe_np${_np} NP ${_np} LABELS "python;moe" TIMEOUT 300
                       COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_pytest.sh ${TORUS_PYTHON_EXECUTABLE} ${PROJECT_BINARY_DIR}/python
                               ${CMAKE_CURRENT_LIST_DIR}/test_moe.py)
  endforeach()
  if(TORUS_WITH_OFI)
    # On ofi, where torus.init installs the shared host allocator.
    torus_add_mpi_test(NAME python_comm_ofi_np2 NP 2 LABELS "python;ofi" TIMEOUT 300 ENV TORUS_BACKEND=ofi
                       COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_pytest.sh ${TORUS_PYTHON_EXECUTABLE} ${PROJECT_BINARY_DIR}/python
                               ${CMAKE_CURRENT_LIST_DIR}/test_comm.py)
  endif()

  # torus.optim against torch.optim: one process, no launcher.
  add_test(NAME python_optim
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_pytest.sh ${TORUS_PYTHON_EXECUTABLE} ${PROJECT_BINARY_DIR}/python
                   ${CMAKE_CURRENT_LIST_DIR}/test_optim.py)
  set_tests_properties(python_optim PROPERTIES TIMEOUT 300 LABELS "unit;python;optim" ENVIRONMENT "TORUS_LOG_LEVEL=warn")

  # torus.data.prepare: text files -> .tok and Megatron .bin/.idx with a tokenizer trained in the test, read back
  # by numpy; one process, no network (skips when the tokenizers package is missing).
  add_test(NAME python_data_prepare
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_pytest.sh ${TORUS_PYTHON_EXECUTABLE} ${PROJECT_BINARY_DIR}/python
                   ${CMAKE_CURRENT_LIST_DIR}/test_data_prepare.py)
  set_tests_properties(python_data_prepare PROPERTIES TIMEOUT 120 LABELS "unit;python;data")

  # torus.checkpoint and torus-ckpt: resume, export read by the safetensors package, verify, TrainLoop options.
  add_test(NAME python_checkpoint
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_pytest.sh ${TORUS_PYTHON_EXECUTABLE} ${PROJECT_BINARY_DIR}/python
                   ${CMAKE_CURRENT_LIST_DIR}/test_checkpoint.py)
  set_tests_properties(python_checkpoint PROPERTIES TIMEOUT 300 LABELS "unit;python;checkpoint"
                       ENVIRONMENT "TORUS_LOG_LEVEL=warn")

  # Hugging Face interop against transformers: torus-ckpt export-hf loaded by from_pretrained, and
  # --init-from a save_pretrained directory, each with equal losses (GPT-2 and Llama); one process.
  add_test(NAME python_hf
           COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_pytest.sh ${TORUS_PYTHON_EXECUTABLE} ${PROJECT_BINARY_DIR}/python
                   ${CMAKE_CURRENT_LIST_DIR}/test_hf.py)
  set_tests_properties(python_hf PROPERTIES TIMEOUT 300 LABELS "unit;python;checkpoint"
                       ENVIRONMENT "TORUS_LOG_LEVEL=warn")

  # The same against transformers in tp2 x pp2 (--model DIR --init-from DIR): evaluation and AdamW steps.
  torus_add_mpi_test(NAME python_hf_tp2pp2_np4 NP 4 LABELS "python;checkpoint" TIMEOUT 300
                     COMMAND ${CMAKE_CURRENT_LIST_DIR}/run_pytest.sh ${TORUS_PYTHON_EXECUTABLE} ${PROJECT_BINARY_DIR}/python
                             ${CMAKE_CURRENT_LIST_DIR}/test_hf_layouts.py)

  # examples/python/train_gpt.py: --help, a bad flag, a PP=2 run on 2 ranks (metrics, log, TensorBoard, plot),
  # and torus-train with the same options writing the same records.
  add_test(NAME python_train_example
           COMMAND ${TORUS_PYTHON_EXECUTABLE} ${CMAKE_CURRENT_LIST_DIR}/train_example_test.py ${TORUS_PYTHON_EXECUTABLE}
                   ${PROJECT_BINARY_DIR}/python $<TARGET_FILE:torus-train> ${TORUS_MPIEXEC} ${TORUS_TEST_MPIRUN_FLAGS}
                   -x TORUS_LOG_LEVEL=warn)
  set_tests_properties(python_train_example PROPERTIES TIMEOUT 600 LABELS "multirank;np2;python;train" PROCESSORS 1)
endif()
