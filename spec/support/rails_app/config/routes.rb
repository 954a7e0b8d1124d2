# frozen_string_literal: true

Rails.application.routes.draw do
  get "up", to: proc { [200, { "Content-Type" => "text/plain" }, ["up"]] }
  post "locks/wait", to: "locks#wait"
  post "locks/try", to: "locks#try"
  resources :bookings, only: %i[index create]
  post "readme/bookings", to: "readme_bookings#create"
  resources :counters, only: %i[create show] do
    post :bump, on: :member
  end
end
