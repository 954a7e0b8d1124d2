# frozen_string_literal: true

# As docs/web.md says (the README points there).
require "sidekiq/web"
require "lock_manager/web" # after sidekiq/web: registers the tab

Rails.application.routes.draw do
  mount Sidekiq::Web => "/sidekiq"
  get "pages/:id", to: "pages#show"
end
