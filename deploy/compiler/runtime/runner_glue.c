/* What deploy-run (run.cc, the same for every bundle) calls: this bundle's signature and API. */
#include "bundle.h"

#include DEPLOY_HEADER

#include "bundle_names.h"

#ifdef DEPLOY_OPENCL /* bundle_config.h of an OpenCL bundle: no threads, a device to choose */
#define THREADS NULL
#define SELECT_DEVICE DEPLOY_API(_cl_open)
#else
#define THREADS DEPLOY_API(_set_num_threads)
#define SELECT_DEVICE NULL
#endif

const DeployRunner deploy_runner = {
    DEPLOY_STRING(DEPLOY_PREFIX), DEPLOY_NUM_INPUTS, DEPLOY_NUM_OUTPUTS, deploy_symbol_names, deploy_tensors,
    DEPLOY_API(_run), DEPLOY_API(_last_error), THREADS, SELECT_DEVICE,
};
