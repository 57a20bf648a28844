/* What deploy-run (run.cc, the same for every bundle) calls: this bundle's signature and API. */
#include "bundle.h"

#include DEPLOY_HEADER

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define API(suffix) CAT(DEPLOY_PREFIX, suffix)
#define STRING_(x) #x
#define STRING(x) STRING_(x)

const DeployRunner deploy_runner = {
    STRING(DEPLOY_PREFIX), DEPLOY_NUM_INPUTS, DEPLOY_NUM_OUTPUTS, deploy_symbol_names, deploy_tensors, API(_run),
    API(_last_error), API(_set_num_threads),
};
